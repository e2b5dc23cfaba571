// The main of C++ twins (`cudnn-dsl emit --format cpp`): builds each graph of graphs.cpp with the cuDNN Frontend (a
// graph cuDNN takes only in parts: each part, a graph of its own) and prints its plan's name; on a GPU runs it on the
// inputs `cudnn-dsl run` draws (read from inputs/), its parts in order, and prints a checksum of each output. Without
// a GPU it plans for the target, from device.json, as `cudnn-dsl check --target` does.
//
//   main [GRAPH...] [--deviceless] [--plan [PART/]ENGINE[:KNOB=VALUE,...]]... [--outputs DIR] [--list]
//     GRAPH          the graphs to plan (and run), by name; default: every graph of the project
//     --deviceless   plan for the target even where a GPU is visible
//     --plan         build this engine with these knobs (the frontend's knob names, or kN: the knob's number in the
//                    library, as plan names spell it), or the plan main printed (eng4_k24=43), as `cudnn-dsl run
//                    --plan` does; for one graph; PART/ pins that part of a graph in parts (a --plan for each part)
//     --outputs DIR  write each output's memory to DIR/GRAPH/OUTPUT.bin (on a GPU)
//     --list         print the graphs' names
#include <dlfcn.h>

#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>

#include "twin.h"

namespace fe = cudnn_frontend;

namespace {

const char* const USAGE =
    "usage: main [GRAPH...] [--deviceless] [--plan [PART/]ENGINE[:KNOB=VALUE,...]]... [--outputs DIR] [--list]";

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

// The name main gives a graph or one of its parts: resnet_block, resnet_block part 2.
std::string label(const Twin& twin, const Part& part) {
    return std::string(twin.name) + (part.index ? " part " + std::to_string(part.index) : "");
}

// (engine, knobs by the library's number) of a plan name as cuDNN prints it, eng4_k24=43_k17=1; false for another.
bool numbered(const std::string& name, int64_t& engine, std::map<int64_t, int64_t>& knobs) {
    static const std::regex whole(R"(eng(\d+)((?:_k\d+=-?\d+)*))"), knob(R"(_k(\d+)=(-?\d+))");
    std::smatch m;
    if (!std::regex_match(name, m, whole)) return false;
    engine = std::stoll(m[1]);
    knobs.clear();
    std::string rest = m[2];
    for (std::sregex_iterator it(rest.begin(), rest.end(), knob), end; it != end; ++it)
        knobs[std::stoll((*it)[1])] = std::stoll((*it)[2]);
    return true;
}

// An engine id and knobs, spelled as `cudnn-dsl run --plan` takes them: 4:KERNEL_CFG=43,SPLIT_K_SLC=1 or 4:k24=43;
// with PART/ before it, for that part of a graph in parts.
struct Pin {
    std::string text;
    int part = 0;
    int64_t engine = -1;
    std::unordered_map<fe::KnobType_t, int64_t> knobs;
    std::map<int64_t, int64_t> numbers;  // every knob, by the library's number
    bool unnamed = false;  // a knob the frontend has no name for: the plan is found among the listed ones
};

// A whole decimal integer: std::stoll alone reads "4x" as 4.
int64_t integer(const std::string& text) {
    size_t used = 0;
    if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-'))
        throw std::invalid_argument(text);
    int64_t value = std::stoll(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    return value;
}

// A knob by the library's number: the frontend's name for it, or none (NOT_SET), when the plan is looked up by number.
void add_numbered(Pin& pin, int64_t number, int64_t value) {
    auto knob = fe::convert_from_backend_knob_type(static_cast<cudnnBackendKnobType_t>(number));
    pin.unnamed = pin.unnamed || knob == fe::KnobType_t::NOT_SET;
    pin.numbers[number] = value;
    if (knob != fe::KnobType_t::NOT_SET) pin.knobs[knob] = value;
}

Pin parse_pin(const std::string& text) {
    Pin pin{text};
    size_t slash = text.find('/'), from = slash == std::string::npos ? 0 : slash + 1;
    size_t colon = text.find(':', from);
    try {
        if (from) pin.part = static_cast<int>(integer(text.substr(0, slash)));
        if (from && pin.part < 1) throw std::invalid_argument(text);
        std::map<int64_t, int64_t> knobs;
        if (numbered(text.substr(from), pin.engine, knobs)) {  // a plan's name as main prints it: eng4_k24=43
            for (auto [number, value] : knobs) add_numbered(pin, number, value);
            return pin;
        }
        pin.engine = integer(text.substr(from, colon == std::string::npos ? colon : colon - from));
        for (size_t at = colon; at != std::string::npos && at + 1 < text.size();) {
            size_t end = text.find(',', at + 1);
            std::string item = text.substr(at + 1, end == std::string::npos ? end : end - at - 1);
            size_t eq = item.find('=');
            if (eq == std::string::npos) throw std::invalid_argument(item);
            std::string name = item.substr(0, eq);
            int64_t number = -1;
            if (name.size() > 1 && (name[0] == 'k' || name[0] == 'K') &&
                name.find_first_not_of("0123456789", 1) == std::string::npos) {
                number = std::stoll(name.substr(1));
            } else {
                auto knob = fe::KnobType_t::NOT_SET;  // what the frontend's names give an unknown one
                fe::graph::from_json(nlohmann::json(name), knob);
                cudnnBackendKnobType_t backend;
                if (knob == fe::KnobType_t::NOT_SET ||
                    fe::convert_to_backend_knob_type(knob, backend) != CUDNN_STATUS_SUCCESS)
                    throw std::invalid_argument(item);
                number = backend;
            }
            add_numbered(pin, number, integer(item.substr(eq + 1)));
            at = end;
        }
    } catch (const std::exception&) {
        fail("--plan " + text + " is not [PART/]ENGINE[:KNOB=VALUE,...] with the frontend's knob names or kN, " +
             "nor [PART/] and a plan's name");
    }
    return pin;
}

// The index of the listed plan a pin names, by the numbers in its name; -1 when none is listed.
int64_t listed(fe::graph::Graph& g, const Pin& pin, std::string& offered) {
    for (int64_t i = 0; i < g.get_execution_plan_count(); ++i) {
        std::string name;
        int64_t engine = -1;
        std::map<int64_t, int64_t> knobs;
        if (g.get_plan_name_at_index(i, name).is_bad()) continue;
        offered += " " + name;
        if (numbered(name, engine, knobs) && engine == pin.engine && knobs == pin.numbers) return i;
    }
    return -1;
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
int64_t build_first(const Twin& twin, fe::graph::Graph& g, bool deviceless, const std::string& name) {
    std::string failures;
    for (int64_t i = 0; i < g.get_execution_plan_count(); ++i) {
        if (excluded(twin, g, i)) continue;
        fe::error_t status = g.build_plan_at_index(i);
        if (status.is_good() || deviceless_ok(deviceless, status)) return i;
        failures += " [" + std::to_string(i) + "] " + status.get_message();
    }
    fail(name + ": no plan built:" + failures);
}

// The plan index built (-1: the frontend's own choice), as `run` plans: the heuristics' plans under the
// constraints, or the pinned engine and knobs (found among the listed plans where the frontend cannot make it).
int64_t plan(const Twin& twin, const Part& part, fe::graph::Graph& g, cudnnHandle_t handle, bool deviceless,
             const Pin* pin) {
    std::string name = label(twin, part);
    check(g.validate(), name + ": validate");
    check(deviceless ? g.build_operation_graph() : g.build_operation_graph(handle), name + ": build_operation_graph");
    bool among_listed = !pin || pin->unnamed;
    if (among_listed) {
        auto modes = pin ? twin.pinned_modes : twin.heuristic_modes;
        check(g.create_execution_plans(modes), name + ": create_execution_plans");
        if (twin.deterministic) g.deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
        if (twin.no_runtime_compilation) g.deselect_behavior_notes({fe::BehaviorNote_t::RUNTIME_COMPILATION});
    } else {
        check(g.create_execution_plan(pin->engine, pin->knobs), name + ": create_execution_plan");
    }
    int64_t pinned = g.get_execution_plan_count() - 1;
    if (pin && pin->unnamed) {
        std::string offered;
        pinned = listed(g, *pin, offered);
        if (pinned < 0) fail(name + ": cuDNN does not offer plan " + pin->text + "; it offers" + offered);
    }
    if (twin.workspace_limit >= 0) g.deselect_workspace_greater_than(twin.workspace_limit);
    check(g.check_support(), name + ": check_support");
    if (pin) {
        fe::error_t status = g.build_plan_at_index(pinned);
        if (status.is_bad() && !deviceless_ok(deviceless, status)) check(status, name + ": the pinned plan");
        return pinned;
    }
    if (deviceless || twin.constrained) return build_first(twin, g, deviceless, name);
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

// Runs the parts in order on memory allocated once: what a part makes for a later one is bound in both packs.
void run(const Twin& twin, std::vector<std::unique_ptr<fe::graph::Graph>>& graphs, cudnnHandle_t handle,
         const char* outputs_dir) {
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
    for (size_t k = 0; k < twin.parts.size(); ++k) {
        const Part& part = twin.parts[k];
        fe::graph::Graph& g = *graphs[k];
        std::unordered_map<int64_t, void*> pack;
        for (const auto& b : part.bound) pack[b.uid] = memory.at(b.name);
        for (const auto& s : part.host_scalars) pack[s.uid] = const_cast<uint8_t*>(s.bytes.data());
        int64_t size = 0;
        check(g.get_workspace_size(size), label(twin, part) + ": get_workspace_size");
        void* workspace = nullptr;
        check_cuda(cudaMalloc(&workspace, size > 0 ? size : 1), "cudaMalloc");
        allocations.push_back(workspace);
        check(g.execute(handle, pack, workspace), label(twin, part) + ": execute");
    }
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

// The pin of each part (nullptr: none), checked against the graph's parts.
std::vector<const Pin*> pins_of(const Twin& twin, const std::vector<Pin>& pins) {
    std::vector<const Pin*> of(twin.parts.size(), nullptr);
    for (const Pin& pin : pins) {
        size_t k = 0;
        while (k < twin.parts.size() && twin.parts[k].index != pin.part) ++k;
        if (k == twin.parts.size())
            fail("--plan " + pin.text + ": graph " + twin.name +
                 (pin.part ? " has no cuDNN part " + std::to_string(pin.part)
                           : " runs in parts: give the part, PART/ENGINE..."));
        if (of[k]) fail("--plan " + pin.text + ": " + label(twin, twin.parts[k]) + " is pinned already");
        of[k] = &pin;
    }
    return of;
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
    std::vector<Pin> pins;
    std::vector<const Twin*> chosen;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--deviceless") {
            deviceless = true;
        } else if (arg == "--outputs" && i + 1 < argc) {
            outputs_dir = argv[++i];
        } else if (arg == "--plan" && i + 1 < argc) {
            pins.push_back(parse_pin(argv[++i]));
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
    if (!pins.empty() && chosen.size() != 1) fail("--plan is for one graph: name it");
    load_driver();
    deviceless = deviceless || !gpu_visible();
    cudnnHandle_t handle = nullptr;
    if (!deviceless && cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) fail("cudnnCreate failed");
    auto properties = deviceless ? target_properties() : nullptr;
    for (const Twin* twin : chosen) {
        auto pinned = pins_of(*twin, pins);
        std::vector<std::unique_ptr<fe::graph::Graph>> graphs;
        for (size_t k = 0; k < twin->parts.size(); ++k) {
            const Part& part = twin->parts[k];
            fe::graph::Graph& g = *graphs.emplace_back(std::make_unique<fe::graph::Graph>());
            // Before the ops: each op takes the graph's SM version when it is added (attention asks the device else).
            if (deviceless) g.set_device_properties(properties).set_sm_version(TARGET_SM_VERSION);
            part.define_graph(g);
            int64_t index = plan(*twin, part, g, handle, deviceless, pinned[k]);
            std::string name;
            check(index < 0 ? g.get_plan_name(name) : g.get_plan_name_at_index(index, name), "get_plan_name");
            std::printf("graph %s: plan %s%s%s\n", label(*twin, part).c_str(), name.c_str(),
                        deviceless ? " for " : "", deviceless ? TARGET_NAME : "");
        }
        if (!deviceless) run(*twin, graphs, handle, outputs_dir);
    }
    return 0;
}
