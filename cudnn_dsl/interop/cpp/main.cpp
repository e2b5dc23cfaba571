// The main of C++ twins (`cudnn-dsl emit --format cpp`): builds each graph of graphs.cpp with the cuDNN Frontend and
// prints its plan's name; on a GPU runs it on the inputs `cudnn-dsl run` draws (read from inputs/) and prints a
// checksum of each output. Without a GPU it plans for the target, from device.json, as `cudnn-dsl check --target`
// does.
//
//   main [GRAPH...] [--deviceless] [--plan ENGINE[:KNOB=VALUE,...]] [--outputs DIR] [--list]
//     GRAPH          the graphs to plan (and run), by name; default: every graph of the project
//     --deviceless   plan for the target even where a GPU is visible
//     --plan         build this engine with these knobs (the frontend's knob names), as `cudnn-dsl run --plan`
//                    does; for one graph
//     --outputs DIR  write each output's memory to DIR/GRAPH/OUTPUT.bin (on a GPU)
//     --list         print the graphs' names
#include <dlfcn.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>

#include "twin.h"

namespace fe = cudnn_frontend;

namespace {

const char* const USAGE =
    "usage: main [GRAPH...] [--deviceless] [--plan ENGINE[:KNOB=VALUE,...]] [--outputs DIR] [--list]";

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "main: %s\n", what.c_str());
    std::exit(1);
}

void check(fe::error_t status, const std::string& step) {
    if (status.is_bad()) fail(step + " failed: " + status.get_message());
}

void check_cuda(cudaError_t status, const char* what) {
    if (status != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(status));
}

std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("cannot read " + path);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// cuDNN's engine libraries link libcuda.so.1: where no driver provides it, the project's stand-in does (every
// driver call answers CUDA_ERROR_NO_DEVICE), loaded before cuDNN loads them.
void load_driver() {
    if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) return;
    if (!dlopen(NO_DEVICE_DRIVER, RTLD_NOW | RTLD_GLOBAL)) fail(std::string("cannot load ") + dlerror());
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

// An engine id and knobs, spelled as `cudnn-dsl run --plan` takes them: 4:KERNEL_CFG=43,SPLIT_K_SLC=1.
struct Pin {
    int64_t engine = -1;
    std::unordered_map<fe::KnobType_t, int64_t> knobs;
};

Pin parse_pin(const std::string& text) {
    Pin pin;
    size_t colon = text.find(':');
    try {
        pin.engine = std::stoll(text.substr(0, colon));
        for (size_t at = colon; at != std::string::npos && at + 1 < text.size();) {
            size_t end = text.find(',', at + 1);
            std::string item = text.substr(at + 1, end == std::string::npos ? end : end - at - 1);
            size_t eq = item.find('=');
            auto knob = fe::KnobType_t::NOT_SET;  // what the frontend's names give an unknown one
            fe::graph::from_json(nlohmann::json(item.substr(0, eq)), knob);
            if (eq == std::string::npos || knob == fe::KnobType_t::NOT_SET) throw std::invalid_argument(item);
            pin.knobs[knob] = std::stoll(item.substr(eq + 1));
            at = end;
        }
    } catch (const std::exception&) {
        fail("--plan " + text + " is not ENGINE[:KNOB=VALUE,...] with the frontend's knob names");
    }
    return pin;
}

bool excluded(const Twin& twin, fe::graph::Graph& g, int64_t index) {
    int64_t engine = -1;
    std::unordered_map<fe::KnobType_t, int64_t> knobs;
    if (g.get_engine_and_knobs_at_index(index, engine, knobs).is_bad()) return false;
    for (auto e : twin.excluded_engines)
        if (e == engine) return true;
    return false;
}

// Whether a plan that failed to build would build on the target: without a device, a kernel that cannot load
// without a driver stops the build at its plan.
bool deviceless_ok(bool deviceless, fe::error_t status) {
    return deviceless && status.get_message().find("CUDA_DRIVER") != std::string::npos;
}

// The first plan the constraints leave that builds, as `run` walks them.
int64_t build_first(const Twin& twin, fe::graph::Graph& g, bool deviceless) {
    std::string failures;
    for (int64_t i = 0; i < g.get_execution_plan_count(); ++i) {
        if (excluded(twin, g, i)) continue;
        fe::error_t status = g.build_plan_at_index(i);
        if (status.is_good() || deviceless_ok(deviceless, status)) return i;
        failures += " [" + std::to_string(i) + "] " + status.get_message();
    }
    fail(std::string(twin.name) + ": no plan built:" + failures);
}

// The plan index built (-1: the frontend's own choice), as `run` plans: the heuristics' plans under the
// constraints, or the pinned engine and knobs.
int64_t plan(const Twin& twin, fe::graph::Graph& g, cudnnHandle_t handle, bool deviceless, const Pin* pin) {
    std::string name = twin.name;
    check(g.validate(), name + ": validate");
    check(deviceless ? g.build_operation_graph() : g.build_operation_graph(handle), name + ": build_operation_graph");
    if (pin) {
        check(g.create_execution_plan(pin->engine, pin->knobs), name + ": create_execution_plan");
    } else {
        check(g.create_execution_plans(twin.heuristic_modes), name + ": create_execution_plans");
        if (twin.deterministic) g.deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
        if (twin.no_runtime_compilation) g.deselect_behavior_notes({fe::BehaviorNote_t::RUNTIME_COMPILATION});
    }
    if (twin.workspace_limit >= 0) g.deselect_workspace_greater_than(twin.workspace_limit);
    check(g.check_support(), name + ": check_support");
    if (pin) {
        int64_t index = g.get_execution_plan_count() - 1;
        fe::error_t status = g.build_plan_at_index(index);
        if (status.is_bad() && !deviceless_ok(deviceless, status)) check(status, name + ": the pinned plan");
        return index;
    }
    if (deviceless || twin.constrained) return build_first(twin, g, deviceless);
    auto policy = twin.build_all ? fe::BuildPlanPolicy_t::ALL : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE;
    check(g.build_plans(policy), name + ": build_plans");
    return -1;
}

// FNV-1a, 64 bits, of an output's memory as cuDNN wrote it.
uint64_t fnv1a(const std::vector<uint8_t>& bytes) {
    uint64_t h = 14695981039346656037ull;
    for (auto b : bytes) h = (h ^ b) * 1099511628211ull;
    return h;
}

void run(const Twin& twin, fe::graph::Graph& g, cudnnHandle_t handle, const char* outputs_dir) {
    std::unordered_map<std::string, uint8_t*> memory;
    std::vector<void*> allocations;
    for (const auto& m : twin.memories) {
        void* p = nullptr;
        check_cuda(cudaMalloc(&p, m.nbytes ? m.nbytes : 1), "cudaMalloc");
        allocations.push_back(p);
        if (m.file) {
            auto bytes = read_file(std::string(PROJECT_DIR) + "/" + m.file);
            if (bytes.size() != m.nbytes) fail(std::string(m.file) + " does not hold " + m.name + "'s bytes");
            check_cuda(cudaMemcpy(p, bytes.data(), m.nbytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        }
        memory[m.name] = static_cast<uint8_t*>(p);
    }
    for (const auto& v : twin.views) memory[v.name] = memory.at(v.of) + v.offset;
    std::unordered_map<int64_t, void*> pack;
    for (const auto& b : twin.bound) pack[b.uid] = memory.at(b.name);
    for (const auto& s : twin.host_scalars) pack[s.uid] = const_cast<uint8_t*>(s.bytes.data());
    int64_t size = 0;
    check(g.get_workspace_size(size), "get_workspace_size");
    void* workspace = nullptr;
    check_cuda(cudaMalloc(&workspace, size > 0 ? size : 1), "cudaMalloc");
    allocations.push_back(workspace);
    check(g.execute(handle, pack, workspace), std::string(twin.name) + ": execute");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (const auto& o : twin.outputs) {
        std::vector<uint8_t> host(o.nbytes);
        check_cuda(cudaMemcpy(host.data(), memory.at(o.name), o.nbytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
        std::printf("  output %s: fnv1a64 %016" PRIx64 " (%zu bytes)\n", o.name, fnv1a(host), o.nbytes);
        if (!outputs_dir) continue;
        auto dir = std::filesystem::path(outputs_dir) / twin.name;
        std::filesystem::create_directories(dir);
        std::ofstream f(dir / (std::string(o.name) + ".bin"), std::ios::binary);
        f.write(reinterpret_cast<const char*>(host.data()), static_cast<std::streamsize>(o.nbytes));
        if (!f) fail("cannot write " + (dir / o.name).string() + ".bin");
    }
    for (void* p : allocations) cudaFree(p);
}

const Twin& named(const std::string& name) {
    std::string known;
    for (const Twin* t : TWINS) {
        if (name == t->name) return *t;
        known += std::string(known.empty() ? "" : ", ") + t->name;
    }
    fail("no graph " + name + " in this project (it has " + known + ")");
}

}  // namespace

int main(int argc, char** argv) {
    bool deviceless = false;
    const char* outputs_dir = nullptr;
    const char* pin_text = nullptr;
    std::vector<const Twin*> chosen;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--deviceless") {
            deviceless = true;
        } else if (arg == "--outputs" && i + 1 < argc) {
            outputs_dir = argv[++i];
        } else if (arg == "--plan" && i + 1 < argc) {
            pin_text = argv[++i];
        } else if (arg == "--list") {
            for (const Twin* t : TWINS) std::printf("%s\n", t->name);
            return 0;
        } else if (arg.rfind("--", 0) == 0) {
            fail("unknown argument " + arg + " (" + USAGE + ")");
        } else {
            chosen.push_back(&named(arg));
        }
    }
    if (chosen.empty()) chosen = TWINS;
    if (pin_text && chosen.size() != 1) fail("--plan is for one graph: name it");
    Pin pin = pin_text ? parse_pin(pin_text) : Pin{};
    load_driver();
    deviceless = deviceless || !gpu_visible();
    cudnnHandle_t handle = nullptr;
    if (!deviceless && cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) fail("cudnnCreate failed");
    auto properties = deviceless ? target_properties() : nullptr;
    for (const Twin* twin : chosen) {
        fe::graph::Graph g;
        // Before the ops: each op takes the graph's SM version when it is added (attention asks the device else).
        if (deviceless) g.set_device_properties(properties).set_sm_version(TARGET_SM_VERSION);
        twin->define_graph(g);
        int64_t index = plan(*twin, g, handle, deviceless, pin_text ? &pin : nullptr);
        std::string name;
        check(index < 0 ? g.get_plan_name(name) : g.get_plan_name_at_index(index, name), "get_plan_name");
        std::printf("graph %s: plan %s%s%s\n", twin->name, name.c_str(), deviceless ? " for " : "",
                    deviceless ? TARGET_NAME : "");
        if (!deviceless) run(*twin, g, handle, outputs_dir);
    }
    return 0;
}
