// The main of a graph's C++ twin (`cudnn-dsl emit --format cpp`): builds the graph of graph.h with the cuDNN
// Frontend, prints the plan's name, and on a GPU runs it on the inputs `cudnn-dsl run` draws (read from inputs/)
// and prints a checksum of each output. Without a GPU it plans for graph.h's target, from device.json, as
// `cudnn-dsl check --target` does, and prints the plan's name.
//
//   main [--deviceless] [--outputs DIR]
//     --deviceless   plan for the target even where a GPU is visible
//     --outputs DIR  write each output's memory to DIR/NAME.bin (on a GPU)
#include <dlfcn.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>
#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;

struct Memory {
    const char* name;
    size_t nbytes;
    const char* file;
};
struct View {
    const char* name;
    const char* of;
    size_t offset;
};
struct Bound {
    const char* name;
    int64_t uid;
};
struct HostScalar {
    int64_t uid;
    std::vector<uint8_t> bytes;
};

#include "graph.h"

namespace {

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "main: %s\n", what.c_str());
    std::exit(1);
}

void check(fe::error_t status, const char* step) {
    if (status.is_bad()) fail(std::string(step) + " failed: " + status.get_message());
}

void check_cuda(cudaError_t status, const char* what) {
    if (status != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(status));
}

std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("cannot read " + path);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// cuDNN's engine libraries link libcuda.so.1: where no driver provides it, the stand-in this project builds does
// (every driver call answers CUDA_ERROR_NO_DEVICE), loaded before cuDNN loads them.
void load_driver() {
    if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) return;
    if (!dlopen(NO_DEVICE_DRIVER, RTLD_NOW | RTLD_GLOBAL)) fail(std::string("cannot load ") + NO_DEVICE_DRIVER);
}

bool gpu_visible() {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::shared_ptr<const fe::DeviceProperties> target_properties() {
    auto text = read_file(std::string(PROJECT_DIR) + "/device.json");
    auto properties = std::make_shared<fe::DeviceProperties>();
    check(properties->deserialize(text), "reading device.json");
    return properties;
}

bool excluded(const fe::graph::Graph& g, int64_t index) {
    int64_t engine = -1;
    std::unordered_map<fe::KnobType_t, int64_t> knobs;
    if (g.get_engine_and_knobs_at_index(index, engine, knobs).is_bad()) return false;
    for (auto e : emitted::EXCLUDED_ENGINES)
        if (e == engine) return true;
    return false;
}

// The first plan the constraints leave that builds, as `run` walks them; without a device, a kernel that cannot
// load without a driver ends the walk at its plan (it would build on the target).
int64_t build_first(fe::graph::Graph& g, bool deviceless) {
    std::string failures;
    for (int64_t i = 0; i < g.get_execution_plan_count(); ++i) {
        if (excluded(g, i)) continue;
        fe::error_t status = g.build_plan_at_index(i);
        if (status.is_good()) return i;
        if (deviceless && status.get_message().find("CUDA_DRIVER") != std::string::npos) return i;
        failures += " [" + std::to_string(i) + "] " + status.get_message();
    }
    fail("no plan built:" + failures);
}

int64_t plan(fe::graph::Graph& g, cudnnHandle_t handle, bool deviceless) {
    check(g.validate(), "validate");
    check(deviceless ? g.build_operation_graph() : g.build_operation_graph(handle), "build_operation_graph");
    check(g.create_execution_plans(emitted::HEURISTIC_MODES), "create_execution_plans");
    if (emitted::DETERMINISTIC) g.deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
    if (emitted::NO_RUNTIME_COMPILATION) g.deselect_behavior_notes({fe::BehaviorNote_t::RUNTIME_COMPILATION});
    if (emitted::WORKSPACE_LIMIT >= 0) g.deselect_workspace_greater_than(emitted::WORKSPACE_LIMIT);
    check(g.check_support(), "check_support");
    if (deviceless || emitted::CONSTRAINED) return build_first(g, deviceless);
    auto policy = emitted::BUILD_ALL ? fe::BuildPlanPolicy_t::ALL : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE;
    check(g.build_plans(policy), "build_plans");
    return -1;  // the frontend's own choice
}

// FNV-1a, 64 bits, of an output's memory as cuDNN wrote it.
uint64_t fnv1a(const std::vector<uint8_t>& bytes) {
    uint64_t h = 14695981039346656037ull;
    for (auto b : bytes) h = (h ^ b) * 1099511628211ull;
    return h;
}

void run(fe::graph::Graph& g, cudnnHandle_t handle, const char* outputs_dir) {
    std::unordered_map<std::string, std::pair<uint8_t*, size_t>> memory;
    for (const auto& m : emitted::MEMORIES) {
        void* p = nullptr;
        check_cuda(cudaMalloc(&p, m.nbytes ? m.nbytes : 1), "cudaMalloc");
        if (m.file) {
            auto bytes = read_file(std::string(PROJECT_DIR) + "/" + m.file);
            if (bytes.size() != m.nbytes) fail(std::string(m.file) + " does not hold " + m.name + "'s bytes");
            check_cuda(cudaMemcpy(p, bytes.data(), m.nbytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        }
        memory[m.name] = {static_cast<uint8_t*>(p), m.nbytes};
    }
    for (const auto& v : emitted::VIEWS) {
        auto base = memory.at(v.of);
        memory[v.name] = {base.first + v.offset, base.second - v.offset};
    }
    std::unordered_map<int64_t, void*> pack;
    for (const auto& b : emitted::BOUND) pack[b.uid] = memory.at(b.name).first;
    for (const auto& s : emitted::HOST_SCALARS) pack[s.uid] = const_cast<uint8_t*>(s.bytes.data());
    int64_t size = 0;
    check(g.get_workspace_size(size), "get_workspace_size");
    void* workspace = nullptr;
    check_cuda(cudaMalloc(&workspace, size > 0 ? size : 1), "cudaMalloc");
    check(g.execute(handle, pack, workspace), "execute");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (const char* name : emitted::OUTPUTS) {
        auto [p, n] = memory.at(name);
        for (const auto& m : emitted::MEMORIES)  // an output's own size, not what is left of a buffer it views
            if (std::strcmp(m.name, name) == 0) n = m.nbytes;
        std::vector<uint8_t> host(n);
        check_cuda(cudaMemcpy(host.data(), p, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
        std::printf("output %s: fnv1a64 %016" PRIx64 " (%zu bytes)\n", name, fnv1a(host), n);
        if (outputs_dir) std::ofstream(std::string(outputs_dir) + "/" + name + ".bin", std::ios::binary)
                             .write(reinterpret_cast<const char*>(host.data()), static_cast<std::streamsize>(n));
    }
}

}  // namespace

int main(int argc, char** argv) {
    bool deviceless = false;
    const char* outputs_dir = nullptr;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--deviceless") == 0) {
            deviceless = true;
        } else if (std::strcmp(argv[i], "--outputs") == 0 && i + 1 < argc) {
            outputs_dir = argv[++i];
        } else {
            fail(std::string("unknown argument ") + argv[i] + " (usage: main [--deviceless] [--outputs DIR])");
        }
    }
    load_driver();
    deviceless = deviceless || !gpu_visible();
    cudnnHandle_t handle = nullptr;
    fe::graph::Graph g;
    emitted::define_graph(g);
    if (deviceless) {
        g.set_device_properties(target_properties()).set_sm_version(emitted::TARGET_SM_VERSION);
    } else if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) {
        fail("cudnnCreate failed");
    }
    int64_t index = plan(g, handle, deviceless);
    std::string name;
    check(index < 0 ? g.get_plan_name(name) : g.get_plan_name_at_index(index, name), "get_plan_name");
    std::printf("graph %s: plan %s%s%s\n", emitted::GRAPH_NAME, name.c_str(), deviceless ? " for " : "",
                deviceless ? emitted::TARGET_NAME : "");
    if (!deviceless) run(g, handle, outputs_dir);
    return 0;
}
