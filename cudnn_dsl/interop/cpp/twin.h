// What a graph's C++ twin is to main (`cudnn-dsl emit --format cpp`): graphs.cpp defines one Twin per graph (its
// parts: one for a graph cuDNN takes whole), and main.cpp plans and runs them.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include <cudnn_frontend.h>

// An allocation of main's: the bytes it holds, and the input file it starts as (nullptr: left uninitialised).
struct Memory {
    const char* name;
    size_t nbytes;
    const char* file;
};

// A tensor in another's memory: a view at a byte offset, an output written over the value it replaces, or a
// reshape between parts (its result its operand's memory, or its operand made in the output it is viewed as).
struct View {
    const char* name;
    const char* of;
    size_t offset;
};

// A tensor of the variant pack: its name, for its memory, and its uid.
struct Bound {
    const char* name;
    int64_t uid;
};

// A pass-by-value scalar: its uid and the bytes cuDNN reads from host memory.
struct HostScalar {
    int64_t uid;
    std::vector<uint8_t> bytes;
};

// An output: its memory's bytes (a view's own, not what is left of the buffer it views).
struct Output {
    const char* name;
    size_t nbytes;
};

// One cuDNN graph main builds, plans and launches: a graph whole, or one part of a graph cuDNN takes only in parts.
struct Part {
    int index;  // the part's number in the graph's partition, as `cudnn-dsl check` counts them; 0: the graph whole
    void (*define_graph)(cudnn_frontend::graph::Graph& g);
    std::vector<Bound> bound;  // its variant pack
    std::vector<HostScalar> host_scalars;
};

struct Twin {
    const char* name;
    std::vector<Part> parts;  // launched in order, on the memory below
    // The plan constraints, as the graph's options give them.
    std::vector<cudnn_frontend::HeurMode_t> heuristic_modes;
    std::vector<cudnn_frontend::HeurMode_t> pinned_modes;  // what a pinned plan is looked for among
    std::vector<int64_t> excluded_engines;
    bool constrained;  // a walk over the plans the constraints leave, as run's
    bool build_all;    // build policy ALL, else HEURISTICS_CHOICE
    int64_t workspace_limit;  // bytes; -1: none
    bool deterministic;
    bool no_runtime_compilation;
    std::vector<Memory> memories;  // the graph's, and what a part makes for a later one
    std::vector<View> views;
    std::vector<Output> outputs;
};

extern const char* const TARGET_NAME;     // the GPU main plans for without one (device.json describes it)
extern const int32_t TARGET_SM_VERSION;
extern const std::vector<const Twin*> TWINS;
