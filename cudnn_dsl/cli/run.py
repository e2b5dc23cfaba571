"""`cudnn-dsl run FILE`: compile, execute, compare with the reference, report.

On a machine without a GPU it does what it can: checks the file, asks cuDNN for the target's
plans without a device, runs the PyTorch reference on the CPU, and says what it skipped.
"""

from __future__ import annotations

import os
import stat
import statistics
from pathlib import Path

from cudnn_dsl.cli import common
from cudnn_dsl.cli.progress import Progress

HELP = "compile with cuDNN, run on generated or given inputs, compare with the PyTorch reference"


def register(p) -> None:
    p.add_argument("file", metavar="FILE")
    common.add_build_flags(p, "the file")
    common.add_target_flags(p, "without a GPU here, plan for this GPU (default h200)")
    common.add_plan_flag(p)
    p.add_argument(
        "--input",
        action="append",
        metavar="NAME=FILE",
        help="an input from .pt/.npy/.safetensors instead of generated values",
    )
    p.add_argument(
        "--cast-inputs",
        action="store_true",
        help="convert --input files to the declared dtype even where values change (e.g. float32 -> bf16)",
    )
    p.add_argument("--scalar", action="append", metavar="NAME=VALUE", help="a scalar's value instead of its default")
    p.add_argument(
        "--init",
        action="append",
        metavar="NAME=DIST",
        help="how a generated input is drawn, e.g. x=randn(0,0.5), over the file's init= (docs/language.md lists them)",
    )
    p.add_argument(
        "--no-compare", action="append", metavar="NAME", help="leave an output out of the comparison (still written)"
    )
    p.add_argument("--atol", action="append", metavar="[NAME=]TOL", help="absolute tolerance, for all or one output")
    p.add_argument("--rtol", action="append", metavar="[NAME=]TOL", help="relative tolerance, for all or one output")
    p.add_argument("--cuda-graph", action="store_true", help="capture the execution in a CUDA graph and time replays")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the plan store")
    p.add_argument("--rebuild", action="store_true", help="ignore stored plans; build and store anew")
    p.add_argument(
        "--require-tuned",
        action="store_true",
        help="serve tuned plans only (option require_store_hit): before anything is built, refuse the run, naming "
        "every shape with no tuned plan for this GPU (without one: the --target's) in the plan store or the pinned "
        "fleet stores (CUDNN_DSL_STORE)",
    )
    p.add_argument("--no-reference", action="store_true", help="skip the PyTorch reference and the comparison")
    p.add_argument(
        "--isolate",
        action="store_true",
        help="also run each op alone on the GPU, fed the reference's values of its inputs, and name the first op "
        "that diverges from its reference",
    )
    p.add_argument(
        "--save-outputs",
        metavar="DIR",
        help="write each output to DIR/GRAPH.NAME.pt (without a GPU: the reference's, as .reference.pt)",
    )
    p.add_argument("--json", metavar="FILE", help="write the report as JSON ('-' for stdout)")
    p.add_argument(
        "--dump",
        metavar="DIR",
        help="write what reproduces this run elsewhere into DIR: the file, the "
        "frontend's graph JSON, the plan, inputs, outputs, reference, ejected scripts, environment",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="with --dump or --save-outputs: replace a dump of the same graph, or saved outputs, in DIR",
    )
    p.add_argument(
        "--inputs-from",
        metavar="DIR",
        help="run on the inputs (and, on the same GPU, the plan) of a "
        "--dump, and say whether the outputs are the dump's, bit for bit",
    )
    common.add_require_gpu_flag(
        p, "for GPU runners in CI; without it, run plans without a device, runs the reference on the CPU and exits 0"
    )
    common.add_log_flags(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from cudnn_dsl.target.library import DEFAULT_TARGET, gpu_available

    common.start_logging(args)
    common.check_writable(args.json, "--json")
    for flag, d in (("--save-outputs", args.save_outputs), ("--dump", args.dump)):
        if d and Path(d).exists() and not Path(d).is_dir():
            raise common.UsageError(f"{flag} {d}: not a directory")
    if args.force and not (args.dump or args.save_outputs):
        raise common.UsageError("--force goes with --dump or --save-outputs")
    if args.inputs_from:
        _check_dump_dir(args.inputs_from)
        clash = [f for f in ("input", "init", "scalar", "seed") if getattr(args, f)]
        if clash:
            raise common.UsageError(f"--inputs-from gives every input; it does not go with --{', --'.join(clash)}")
    if args.require_tuned and (args.no_cache or args.rebuild):
        raise common.UsageError("--require-tuned serves stored plans: it does not go with --no-cache or --rebuild")
    if args.require_gpu:
        common.require_gpu("--require-gpu asks for a GPU")
    gpu = gpu_available()
    target = common.target_from(args, default=None if gpu else DEFAULT_TARGET)  # checked before any work
    result = common.load_file(args.file)
    entry = {"file": result.file, "diagnostics": [d.to_json() for d in result.diagnostics], "graphs": []}
    if not result.ok:
        common.write_json(args.json, {"files": [entry]})
        return common.EXIT_FAIL
    graphs = common.select_graphs(result.program, args.graph)
    names = _Names(graphs, args)  # every flag is checked before any work: names, values, options, shapes
    loaded = {name: _load(name, path) for name, path in names.files.items()}
    setups = [_Setup(g, args, loaded, names) for g in graphs]
    if args.dump:  # a directory the dump would be refused is said before any planning
        _check_dump(args, setups)
    _require_tuned(setups, args, gpu, target)
    _say_ignored(args, gpu)
    if not gpu:
        common.warn(
            f"note: no CUDA GPU here: checking, planning for {target.name} without a device, and running "
            f"the PyTorch reference on the CPU; the cuDNN execution is skipped"
        )
    status = common.EXIT_OK
    for setup in setups:
        runner = _GpuRunner(setup) if gpu else _CpuRunner(setup, target)
        for inst in setup.instances:
            try:
                rep = runner.run(inst)
            except Exception as e:  # noqa: BLE001 - one shape's failure is reported; the others still run
                status = max(status, common.report(e))
                continue
            entry["graphs"].append(rep)
            if not rep.get("ok", True):
                status = max(status, common.EXIT_FAIL)
    from cudnn_dsl.target.machine import environment

    common.write_json(args.json, {"files": [entry]}, environment(args.device))
    return status


#: flags that only mean something when the graph runs on a GPU here, and the planning flags that mean nothing then
_GPU_ONLY = ("device", "cuda_graph", "no_cache", "rebuild", "warmup", "iterations", "build_policy")
_NO_GPU_ONLY = ("target", "device_properties")


def _check_dump(args, setups) -> None:
    from cudnn_dsl.debug import dump

    for setup in setups:
        for inst in setup.instances:
            try:
                dump.check_dump(Path(args.dump), Path(setup.graph.file), setup.graph, inst, args.force)
            except dump.Refused as e:
                raise common.UsageError(str(e)) from None


def _say_ignored(args, gpu: bool) -> None:
    unused = [n for n in (_NO_GPU_ONLY if gpu else _GPU_ONLY) if getattr(args, n, None) not in (None, False)]
    if unused:
        flags = ", ".join("--" + n.replace("_", "-") for n in unused)
        why = "they are for planning without a GPU, and this machine has one" if gpu else "no CUDA GPU here"
        common.warn(f"note: {flags} ignored: {why}")


def _require_tuned(setups, args, gpu: bool, target) -> None:
    """--require-tuned, or option require_store_hit: every shape of the run looked up before any build, for this
    GPU or, without one, the target; NotTuned names every one, of every graph, with no tuned plan."""
    wanted = [s for s in setups if s.opts.require_store_hit]
    if not wanted:
        return
    from cudnn_dsl.build.planner import NotTuned, untuned
    from cudnn_dsl.store.fleet import Fleet
    from cudnn_dsl.store.plans import PlanStore

    if gpu:
        import torch

        device = torch.cuda.current_device() if args.device is None else args.device
        name, (major, minor) = torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)
        cc = f"{major}.{minor}"
    else:
        name, cc = target.name, f"{target.sm_version // 10}.{target.sm_version % 10}"
    store, fleet = PlanStore(), Fleet.from_env()
    errors = [d for s in wanted if (d := untuned(s.graph, s.instances, s.opts, name, cc, store, fleet)) is not None]
    if errors:
        raise NotTuned(errors)


def _check_dump_dir(path: str) -> None:
    """A usage error unless --inputs-from names a directory (a FIFO there is named, never opened)."""
    from dsl.files import kind

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise common.UsageError(f"--inputs-from {path}: no such directory") from None
    except OSError as e:
        raise common.UsageError(f"--inputs-from {path}: {e.strerror or e}") from None
    if not stat.S_ISDIR(mode):
        raise common.UsageError(f"--inputs-from {path} is not a directory ({kind(mode)})")


def _load(name: str, path: str):
    from cudnn_dsl.run.buffers import BindingError
    from cudnn_dsl.run.inputs import load_tensor
    from dsl.files import Unreadable

    try:
        return load_tensor(path)
    except Unreadable as e:
        raise common.UsageError(f"--input {name}: {e}") from None
    except BindingError as e:
        raise BindingError(f"--input {name}: {e}") from None


class _Names:
    """The per-name flags, checked against the names of every selected graph (a file's graphs share a run)."""

    def __init__(self, graphs, args):
        from dsl.values import number

        def union(kind):
            return sorted({v.name for g in graphs for v in _of_kind(g, kind)})

        outputs, inputs = union("output"), union("input")
        self.atol = common.named_values(args.atol, "--atol", outputs, common.option_value("atol"), unnamed_ok=True)
        self.rtol = common.named_values(args.rtol, "--rtol", outputs, common.option_value("rtol"), unnamed_ok=True)
        views = common.views_drawn_with_buffers(graphs)
        self.inits = common.named_values(args.init, "--init", inputs, common.init_value, instead=views)
        self.no_compare = set(args.no_compare or ())
        for n in sorted(self.no_compare - set(outputs)):
            raise common.UsageError(f"--no-compare {n}: no '{n}' here; the outputs are {', '.join(outputs)}")
        self.files = common.named_values(args.input, "--input", inputs, str)
        self.scalars = common.named_values(args.scalar, "--scalar", union("scalar"), number)


def _of_kind(graph, kind: str):
    """The values a per-name flag names: for inputs, what the caller binds (buffers, not their views)."""
    return graph.device_inputs if kind == "input" else graph.of_kind(kind)


class _Setup:
    """One graph's share of the flags, converted and checked once: options, shapes, tolerances, inits, scalars."""

    def __init__(self, graph, args, loaded: dict, names: _Names):
        import attrs

        from cudnn_dsl.run.buffers import BindingError, scalar_value
        from dsl.diagnostics import RuleError
        from dsl.inits import check_dtype

        def mine(values: dict, kind: str) -> dict:
            own = {v.name for v in _of_kind(graph, kind)}
            return {k: v for k, v in values.items() if k in own}

        self.graph, self.args = graph, args
        self.from_dump = Path(args.inputs_from) if args.inputs_from else None
        self.opts = common.options_from(args, graph.options)
        if args.require_tuned:
            self.opts = attrs.evolve(self.opts, require_store_hit=True)
        self.pin = common.plan_spec(args)
        self.instances = common.select_instances(graph, args.shape)
        self.loaded = mine(loaded, "input")
        self.atol, self.rtol = mine(names.atol, "output"), mine(names.rtol, "output")
        self.inits = mine(names.inits, "input")
        for name, init in self.inits.items():
            try:
                check_dtype(init, graph.instances[0].type(name).dtype)
            except RuleError as e:
                raise common.UsageError(f"--init {name}: {e}") from None
        self.no_compare = {n for n in names.no_compare if n in {v.name for v in graph.outputs}}
        self.scalars = {}
        for name, value in mine(names.scalars, "scalar").items():
            try:
                self.scalars[name] = scalar_value(name, value, graph.value(name).dtype)
            except BindingError as e:
                raise common.UsageError(f"--scalar {e}") from None

    def files(self, inst) -> dict:
        """The --input files in this shape's dtype; refused (before any planning) when they do not fit."""
        from cudnn_dsl.run.buffers import BindingError, converted

        out = {}
        for name, t in self.loaded.items():
            try:
                out[name] = converted(t, inst.type(name), self.args.cast_inputs)
            except BindingError as e:
                raise BindingError(f"--input {name}: {e}", self.graph.value(name).loc) from None
        return out

    def inputs(self, inst, device, files: dict) -> dict:
        """Generated inputs, the --input files in their place, and the --scalar values; or a dump's inputs. The
        index inputs' values are checked here, before the reference or a launch reads them."""
        from cudnn_dsl.run.indices import check_indices

        tensors = self._inputs(inst, device, files)
        check_indices(self.graph, inst, tensors)
        return tensors

    def _inputs(self, inst, device, files: dict) -> dict:
        from cudnn_dsl.debug import dump
        from cudnn_dsl.run.buffers import BindingError, converted, relayout
        from cudnn_dsl.run.inputs import generate_inputs

        if self.from_dump is not None:
            dumped = dump.read_tensors(self.from_dump, self.graph, inst, "inputs")
            tensors = {}
            for v in self.graph.inputs:
                if v.name not in dumped:
                    if v.kind == "scalar":
                        continue  # the file's value, as when it was dumped
                    raise BindingError(f"--inputs-from {self.from_dump}: no input '{v.name}' in the dump", v.loc)
                t = dumped[v.name]
                if v.kind == "scalar" and t.numel() != 1:
                    raise BindingError(
                        f"--inputs-from {self.from_dump}: the scalar '{v.name}' holds {t.numel()} values, not one",
                        v.loc,
                    )
                tensors[v.name] = (
                    t.item()
                    if v.kind == "scalar"
                    else relayout(converted(t, inst.type(v.name)), inst.type(v.name), device)
                )
            return tensors
        given = {name: relayout(t, inst.type(name), device) for name, t in files.items()}
        tensors = generate_inputs(
            self.graph, inst, device, self.opts.seed, self.inits, given
        )  # offsets: of given lengths
        return {**tensors, **self.scalars}

    def repro(self, inst, got: dict, what: str) -> tuple[list[str], bool]:
        """With --inputs-from: whether these outputs are the dump's, bit for bit: the lines that say so, and
        False when they differ (a reproduction that does not reproduce fails the run, as a mismatch does)."""
        from cudnn_dsl.debug import dump

        if self.from_dump is None:
            return [], True
        want = dump.read_tensors(self.from_dump, self.graph, inst, what)
        if want is None:
            return [f"the dump holds no {what} to compare with"], True
        differ = dump.identical(got, want)
        if differ:
            return [f"{what} differ from the dump's in: {', '.join(differ)}"], False
        return [f"{what} identical to the dump's, bit for bit"], True

    def dump(
        self, inst, inputs: dict, reference, outputs=None, plan=None, fe_json=None, env=None, partition=None
    ) -> None:
        from cudnn_dsl.debug import dump

        if not self.args.dump:
            return
        try:
            written = dump.write(
                Path(self.args.dump),
                Path(self.graph.file),
                self.graph,
                inst,
                inputs,
                reference,
                outputs,
                plan,
                fe_json,
                dump.environment(env or {}),
                options=self.opts,
                inits=self.inits,
                partition=partition,
                replace=self.args.force,
            )
        except dump.Refused as e:
            raise common.UsageError(str(e)) from None
        print(f"  dump       {len(written)} files in {self.args.dump}")

    def save(self, inst, outputs: dict, suffix: str = "") -> list[str]:
        import io

        import torch

        from cudnn_dsl.debug import dump

        if not self.args.save_outputs:
            return []
        files = {}
        for name, t in outputs.items():
            buf = io.BytesIO()
            torch.save(t.detach().cpu(), buf)
            files[f"{dump.stem(self.graph, inst)}.{name}{suffix}.pt"] = buf.getvalue()
        try:
            written = dump.write_new(Path(self.args.save_outputs), files, "--save-outputs", self.args.force)
        except dump.Refused as e:
            raise common.UsageError(str(e)) from None
        return [str(p) for p in written]


class _GpuRunner:
    def __init__(self, setup: _Setup):
        import attrs

        from cudnn_dsl.run.compiled import CompiledGraph

        self.s = setup
        a = setup.args
        opts = attrs.evolve(setup.opts, require_store_hit=False)  # required of this run's shapes, all graphs at once
        self.cg = CompiledGraph(setup.graph, opts, a.device, use_store=not a.no_cache, rebuild=a.rebuild)
        self.cg.planner.plan_spec = setup.pin

    def run(self, inst) -> dict:
        import attrs
        import torch

        from cudnn_dsl.build.steps import timings_text
        from cudnn_dsl.run.buffers import restore, snapshot
        from cudnn_dsl.run.parts import Parts
        from cudnn_dsl.run.timing import gpu_time_us

        cg, s, opts = self.cg, self.s, self.s.opts
        name = common.label(s.graph, inst)
        tensors = s.inputs(inst, cg.device, s.files(inst))
        before = snapshot(s.graph, tensors)  # launches overwrite the inputs of outputs in place
        pinned = self._pin(inst)
        progress = Progress.of(s.args, total=1)
        cg.planner.progress = progress
        with progress.item(name):
            parts = cg.parts(inst)
        if isinstance(parts, Parts):
            return self._run_in_parts(inst, tensors, before, parts)
        with progress.item(name):
            graph_mode = s.args.cuda_graph or opts.cuda_graph
            if graph_mode:
                replay = cg.capture(tensors)
                outputs, launch, exe = replay.outputs, replay.replay, replay.bound.exe
            else:
                bound = cg.bind(tensors)
                outputs, launch, exe = bound.outputs, bound.run, bound.exe
        restore(tensors, before)  # a capture's warm-up launch has overwritten what outputs in place write
        launch()
        torch.cuda.synchronize(cg.device)
        first = {k: v.clone() for k, v in outputs.items()}  # what a repro compares: later launches may differ
        comps, want = _compared(s, cg, inst, first, before)
        times = gpu_time_us(launch, opts.iterations, warmup=opts.warmup)
        low = exe.low
        median = statistics.median(times)
        print(f"graph {name}")
        candidates = f"{low.plan_count} candidates, heuristics {', '.join(opts.modes())}; " if low.plan_count else ""
        print(f"  plan       {exe.plan_name}  ({candidates}from {exe.source})")
        if inst.binding in cg.why:
            print(f"  partition  {cg.why[inst.binding]}")
        for note in exe.notes + cg.planner.kernel_cache_notes + cg.notes:
            print(f"  note       {note}")
        print("  build      " + timings_text(low.timings))
        print(f"  workspace  {exe.workspace_bytes} bytes")
        how = "CUDA-graph replays" if graph_mode else "executions"
        print(
            f"  gpu time   {median:.1f} µs per call ({how}; median of {len(times)} samples, "
            f"min {min(times):.1f}, max {max(times):.1f})"
        )
        _print_compared(s, comps)
        repro, reproduced = s.repro(inst, first, "outputs")
        for line in pinned + repro:
            print(f"  repro      {line}")
        isolated = _isolate(s, inst, tensors, cg.device, cg.drawn(inst, outputs))
        saved = s.save(inst, first)
        if s.args.dump:
            from cudnn_dsl.interop.fe_export import frontend_json
            from cudnn_dsl.target.machine import environment

            engine_id, knobs, blob = cg.planner.plan_of(exe)
            plan = {
                "gpu": cg.planner.device_name,
                "plan_name": exe.plan_name,
                "engine_id": engine_id,
                "knobs": knobs,
                "blob": blob,
            }
            s.dump(
                inst,
                before,
                want,
                first,
                plan,
                frontend_json(s.graph, inst, handle=cg.planner.handle),
                environment(cg.device),
            )
        return {
            "graph": s.graph.name,
            "binding": dict(inst.binding),
            "executed": True,
            "plan": exe.plan_name,
            "source": exe.source,
            "notes": exe.notes,
            "partition": cg.why.get(inst.binding, ""),
            "candidates": low.plan_count,
            "build_s": low.timings,
            "cuda_graph": graph_mode,
            "workspace_bytes": exe.workspace_bytes,
            "gpu_us_median": median,
            "gpu_us": times,
            "compare": [attrs.asdict(c) for c in comps],
            "not_compared": sorted(s.no_compare),
            "ok": all(c.ok for c in comps) and reproduced,
            "saved": saved,
            "isolate": isolated,
        }

    def _run_in_parts(self, inst, tensors: dict, before: dict, parts) -> dict:
        """A shape cuDNN declines whole, run as its parts (cudnn_dsl.run.partition): said, timed, compared."""
        import statistics

        import attrs
        import torch

        from cudnn_dsl.run.buffers import restore
        from cudnn_dsl.run.timing import gpu_time_us

        cg, s, opts = self.cg, self.s, self.s.opts
        graph_mode = s.args.cuda_graph or opts.cuda_graph
        bound = cg.capture(tensors) if graph_mode else cg.bind(tensors)  # every part bound once
        outputs, launch = bound.outputs, bound.replay if graph_mode else bound.run
        restore(tensors, before)  # a capture's warm-up run has overwritten what outputs in place write
        launch()
        torch.cuda.synchronize(cg.device)
        first = {k: v.clone() for k, v in outputs.items()}
        comps, _ = _compared(s, cg, inst, first, before)
        times = gpu_time_us(launch, opts.iterations, warmup=opts.warmup)
        median = statistics.median(times)
        how = "CUDA-graph replays" if graph_mode else "bound executions"
        print(f"graph {common.label(s.graph, inst)}")
        print(f"  split      {parts.partition.reason}; it runs as:")
        for line in parts.lines:
            print(f"  split      {line}")
        print(f"  split      {parts.partition.counts.text}")
        for note in cg.notes:
            print(f"  note       {note}")
        print(f"  gpu time   {median:.1f} µs per call, every part ({how}; median of {len(times)} samples)")
        _print_compared(s, comps)
        return {
            "graph": s.graph.name,
            "binding": dict(inst.binding),
            "executed": True,
            **common.parts_record(s.graph, parts.partition),
            "declined": parts.partition.declined,
            "partition": parts.partition.reason,
            "cuda_graph": graph_mode,
            "gpu_us_median": median,
            "gpu_us": times,
            "compare": [attrs.asdict(c) for c in comps],
            "ok": all(c.ok for c in comps),
        }

    def _pin(self, inst) -> list[str]:
        """With --inputs-from on the GPU the dump was made on: the dump's plan, so the outputs can be compared
        bit for bit."""
        from cudnn_dsl.debug import dump

        if self.s.from_dump is None or self.s.pin is not None:  # --plan wins over the dump's
            return []
        plan = dump.read_plan(self.s.from_dump, self.s.graph, inst)
        planner = self.cg.planner
        if plan is None:
            return ["the dump holds no plan: this run's own plan is used"]
        if plan["gpu"] != planner.device_name:
            return [f"the dump was made on {plan['gpu']}, this is {planner.device_name}: this run's own plan is used"]
        planner.pin(inst, plan["engine_id"], plan["knobs"], f"the dump's plan {plan['plan_name']} (engine id + knobs)")
        return []


def _compared(s: _Setup, cg, inst, got: dict, before: dict) -> tuple[list, dict | None]:
    """The outputs against the reference computed from the inputs as they were before the launch (none
    with --no-reference); and the reference."""
    from cudnn_dsl.run.compare import compare_outputs

    if s.args.no_reference:
        return [], None
    want = cg.reference(before, cg.drawn(inst, got))
    return compare_outputs(s.graph, inst, got, want, s.opts, s.atol, s.rtol, s.no_compare), want


def _print_compared(s: _Setup, comps: list) -> None:
    for c in comps:
        print(f"  compare    {c}")
    for n in sorted(s.no_compare):
        print(f"  compare    {n}: not compared (--no-compare)")
    if s.args.no_reference:
        print("  skipped    the reference and the comparison (--no-reference)")


class _Split(Exception):
    """The graph runs in parts on the target: said; the reference still runs."""


class _CpuRunner:
    def __init__(self, setup: _Setup, target):
        self.s, self.target = setup, target

    def run(self, inst) -> dict:
        from cudnn_dsl.build.steps import timings_text
        from cudnn_dsl.run.compare import reference_bytes
        from cudnn_dsl.run.partition import declined_whole, plan_for_target
        from cudnn_dsl.run.reference import drawn_values, run_reference
        from cudnn_dsl.target.library import BackendUnavailable, answering
        from dsl.diagnostics import DslError

        s, target = self.s, self.target
        name = common.label(s.graph, inst)
        files = s.files(inst)
        print(f"graph {name}")
        rep: dict = {"graph": s.graph.name, "binding": dict(inst.binding), "executed": False, "skipped": {}}
        progress = Progress.of(s.args, total=1)
        partition = None
        try:
            with progress.item(name):
                low, partition = plan_for_target(s.graph, inst, s.opts, target, progress, s.pin)
            library = answering()
            rep["cudnn"] = library.to_json()
            print(f"  cuDNN      {library.version} ({library.path})")
            if partition is not None:
                rep.update(common.parts_record(s.graph, partition))
                print(f"  split      for {target.name} (no device): {declined_whole(partition.declined)}")
                for line in rep["parts"]:
                    print(f"  split      {line}")
                print(f"  split      {partition.counts.text}")
                raise _Split
            rep["plan"] = common.plan_record(s.graph, inst, target, low)
            print(
                f"  plan       for {target.name} (no device): {rep['plan']['first_plan']}  "
                f"({low.plan_count} candidates)"
            )
            print("  build      " + timings_text(low.timings))
            for step, why in low.skipped.items():
                print(f"  skipped    {step}: {why}")
                rep["skipped"][step] = why
        except BackendUnavailable as e:
            if s.args.target or s.args.device_properties:  # asked for by name: its failure is an error
                raise
            print(f"  skipped    cuDNN planning: {e}")
            rep["skipped"]["plan"] = str(e)
        except _Split:
            pass
        except DslError as e:  # the graph is declined (the error says by whom): said, and the reference still runs
            print(f"  plan       for {target.name} (no device): not planned (see the error)")
            common.report(e)
            rep.update(ok=False, error=[d.to_json() for d in e.diagnostics])
        need, have = reference_bytes(s.graph, inst), _available_memory()
        if s.args.no_reference:
            why = "--no-reference"
        elif drawn_values(s.graph, inst):
            why = "seeded dropout: the reference needs cuDNN's mask, drawn on the GPU from the seed and offset"
        elif have is not None and need > have // 2:
            why = f"it would hold about {need / 2**30:.1f} GiB, and {have / 2**30:.1f} GiB of memory is free"
        else:
            why = ""
        if why:
            print(f"  skipped    the PyTorch reference: {why}")
            rep["skipped"]["reference"] = why
            if s.args.dump:
                print("  skipped    --dump: without a GPU it holds the reference, which did not run")
        else:
            inputs = s.inputs(inst, "cpu", files)
            outs = run_reference(s.graph, inst, inputs, "cpu")
            for out_name, t in outs.items():
                f = t.float()
                print(
                    f"  reference  {out_name}: {inst.type(out_name)} on the CPU, mean {f.mean():.4g}, "
                    f"max |x| {f.abs().max():.4g}"
                )
            rep["reference"] = {
                n: {"mean": float(t.float().mean()), "absmax": float(t.float().abs().max())} for n, t in outs.items()
            }
            rep["saved"] = s.save(inst, outs, ".reference")
            if rep["saved"]:
                print(f"  saved      the reference outputs to {s.args.save_outputs} (*.reference.pt)")
            repro, reproduced = s.repro(inst, outs, "reference")
            for line in repro:
                print(f"  repro      {line}")
            if not reproduced:
                rep["ok"] = False
            if s.args.dump:
                from cudnn_dsl.interop.fe_export import frontend_json
                from cudnn_dsl.target.machine import environment

                try:
                    fe_json = frontend_json(s.graph, inst, target)
                except (DslError, BackendUnavailable):  # cuDNN declined it above, and said so
                    fe_json = None
                s.dump(inst, inputs, outs, fe_json=fe_json, env=environment(), partition=partition)
        print(
            f"  skipped    cuDNN execution and comparison{' and --isolate' if s.args.isolate else ''}: no CUDA GPU here"
        )
        rep["skipped"]["execution"] = "no CUDA GPU here"
        return rep


def _isolate(s: _Setup, inst, tensors: dict, device, drawn: dict) -> list[dict]:
    """--isolate: each op alone against its reference, one line each, and the first that diverges."""
    if not s.args.isolate:
        return []
    from cudnn_dsl.debug.isolate import isolate, report

    results = isolate(s.graph, inst, tensors, s.opts, device, drawn)
    for line in report(results):
        print(f"  isolate    {line}")
    return [{"op": r.node.op, "outputs": list(r.node.outputs), "status": r.status, "detail": r.detail} for r in results]


def _available_memory() -> int | None:
    """Bytes of memory free for new allocations (MemAvailable), None where the system does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
