"""`flydsl-translate`: the command-line face of translate().

    flydsl-translate convert models/mini_gpt.py --backend reference --out out/gpt
    flydsl-translate ops
    flydsl-translate --version

`convert` takes a KernelBench-style script (it defines `class Model`,
`get_inputs()` and `get_init_inputs()`; inputs are tensors or Python scalars),
builds the model under torch.manual_seed(0), translates it, prints the report
and writes report.md, report.json, report.html and translated.py into --out
(checked before any work). `--json` prints the report as JSON on stdout and
nothing else there; `--quiet` prints nothing but errors. On a terminal a
progress bar (rich, on stderr) follows capture, passes and verification.

Exit codes: 0 success; 1 verification failed; 2 bad input (script, its
Model/inputs, option values, strict mode, an unusable backend); 3 internal
error (a translator bug). Every failure is ONE line on stderr that names the
problem and the fix; --debug adds the traceback and what torch printed while
capturing (a failed torch.export prints its graph), which is otherwise held back.

The script is loaded under a private module name that is registered in
sys.modules only while the command runs (torch.export may look the module
up), together with the script's folder on sys.path for sibling imports.
`main(argv)` returns the exit code, so tests can call it in-process.
"""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import itertools
import io
import json
import logging
import sys
import tempfile
import traceback
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

import typer

PROG = "flydsl-translate"

EXIT_OK = 0
EXIT_VERIFY_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3

SCRIPT_CONTRACT = "a .py script defining `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`"


class Arch(str, enum.Enum):
    gfx942 = "gfx942"
    gfx950 = "gfx950"


class Backend(str, enum.Enum):
    auto = "auto"
    rocm = "rocm"
    flysim = "flysim"
    reference = "reference"


class Precision(str, enum.Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class CliError(Exception):
    """A failure the user can fix: `message` is the one line shown, `exit_code` the status."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


app = typer.Typer(
    name=PROG,
    help="Translate PyTorch models so their hot ops run as FlyDSL kernels on AMD Instinct GPUs.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: wraps to the terminal (80 columns reads well)
    epilog="\b\nExample:\n  flydsl-translate convert models/mini_gpt.py --out out/gpt\n\n\b\nExit codes: 0 success, "
    "1 verification failed, 2 bad input, 3 internal error\n(`flydsl-translate convert --help` says more).",
)


def _one_line(text: object, limit: int = 300) -> str:
    """The first non-empty line of an exception message, shortened."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _describe(exc: BaseException) -> str:
    msg = _one_line(exc)
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def version_string() -> str:
    def _v(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return f"{PROG} {_v('flydsl-translator')} (flydsl {_v('flydsl')}, torch {_v('torch')})"


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(version_string())
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """Translate PyTorch models so their hot ops run as FlyDSL kernels on AMD Instinct GPUs."""


# --------------------------------------------------------------------------- loading the script

_load_counter = itertools.count()


@contextlib.contextmanager
def loaded_script(path: Path) -> Iterator[Any]:
    """Import the script at `path` as a private module for the duration of the block."""
    if not path.exists():
        raise CliError(f"{path}: no such file; pass the path of {SCRIPT_CONTRACT}")
    if path.is_dir():
        raise CliError(f"{path} is a directory; pass the path of {SCRIPT_CONTRACT}")
    if path.suffix != ".py":
        raise CliError(f"{path} is not a Python file (.py); pass the path of {SCRIPT_CONTRACT}")
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{path} cannot be read ({_describe(exc)}); check the file's permissions and encoding")
    try:
        code = compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise CliError(
            f"{path}:{exc.lineno}: syntax error: {exc.msg}; fix the script "
            f"(`python -m py_compile {path}` shows the same error)"
        )

    name = f"_flydsl_translate_script_{next(_load_counter)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    sys.modules[name] = module
    sys.path.insert(0, folder)
    try:
        try:
            exec(code, module.__dict__)
        except ImportError as exc:
            missing = getattr(exc, "name", None)
            fix = f"install `{missing}` or fix the import" if missing else "fix the import"
            raise CliError(f"{path} failed to import: {_describe(exc)}; {fix}")
        except SystemExit:
            raise CliError(
                f"{path} called sys.exit() while being loaded; put script code under `if __name__ == '__main__':`"
            )
        except Exception as exc:
            line = _script_line(exc, str(path))
            where = f"{path}:{line}" if line else str(path)
            raise CliError(f"{where} raised {_describe(exc)} while being loaded; fix the script so `python {path}` runs")
        yield module
    finally:
        sys.modules.pop(name, None)
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


def _script_line(exc: BaseException, filename: str) -> Optional[int]:
    """The last line of `filename` in the exception's traceback, if any."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == filename:
            line = frame.lineno
    return line


def _exited(exc: SystemExit, where: str) -> "CliError":
    """The user's code called sys.exit() (or raised SystemExit): never a success, always exit 2."""
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""  # where the exit was called
    return CliError(f"{where} called sys.exit({exc.code!r}){at}; the script's functions and forward must return, "
                    "not exit (nothing was translated)")


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def check_inputs(inputs: Any, path: Path) -> list:
    """get_inputs() must give a flat, non-empty list or tuple of tensors and Python scalars."""
    where = f"get_inputs() in {path}"
    if _is_tensor(inputs):
        raise CliError(f"{where} returned a single tensor, not a list; return [x] instead")
    if not isinstance(inputs, (list, tuple)):
        raise CliError(f"{where} returned {type(inputs).__name__}; return a list (or tuple) of torch.Tensor inputs")
    if len(inputs) == 0:
        raise CliError(f"{where} returned an empty list; return the example tensors that Model.forward takes")
    for i, item in enumerate(inputs):
        if _is_tensor(item) or isinstance(item, (int, float, bool)):  # scalars: as translate() takes them
            continue
        kind = type(item).__name__
        if isinstance(item, (list, tuple, dict)):
            raise CliError(
                f"{where}: input {i} is a {kind}; nested inputs are not supported, "
                "return a flat list and make forward take each tensor as its own argument"
            )
        raise CliError(
            f"{where}: input {i} is a {kind}, not a torch.Tensor or a Python number; pass other settings "
            "to the constructor through get_init_inputs()"
        )
    return list(inputs)


def build_model(module: Any, path: Path) -> tuple:
    """Seed torch, build Model(*get_init_inputs()).eval(), call get_inputs(), check both."""
    import torch

    model_cls = getattr(module, "Model", None)
    if model_cls is None:
        raise CliError(f"{path} defines no `Model`; add `class Model(torch.nn.Module)` (the model to translate)")
    if not (isinstance(model_cls, type) and issubclass(model_cls, torch.nn.Module)):
        raise CliError(
            f"`Model` in {path} is a {type(model_cls).__name__}, not a torch.nn.Module subclass; "
            "define `class Model(torch.nn.Module)`"
        )
    for fn, what in (("get_inputs", "a list of example input tensors"), ("get_init_inputs", "a list of Model's constructor arguments")):
        if not callable(getattr(module, fn, None)):
            raise CliError(f"{path} defines no `{fn}()`; add `def {fn}():` returning {what}")

    torch.manual_seed(0)
    init_inputs = _user_call(module.get_init_inputs, f"get_init_inputs() in {path}",
                             "fix it to return Model's constructor arguments")
    if not isinstance(init_inputs, (list, tuple)):
        raise CliError(
            f"get_init_inputs() in {path} returned {type(init_inputs).__name__}; "
            "return a list (or tuple) of Model's constructor arguments ([] for none)"
        )
    model = _user_call(lambda: model_cls(*init_inputs), f"Model(*get_init_inputs()) in {path}",
                       "make get_init_inputs() return the arguments Model.__init__ takes")
    model = model.eval()
    inputs = _user_call(module.get_inputs, f"get_inputs() in {path}", "fix it to return a list of input tensors")
    inputs = check_inputs(inputs, path)
    with torch.no_grad():
        _user_call(lambda: model(*inputs), f"Model(...).forward(*get_inputs()) in {path}",
                   "make get_inputs() return what forward takes")
    return model, inputs


def _user_call(fn, what, fix):
    """fn() of the user's model file; an exit or exception there becomes one CliError naming `what`
    (the call, in the file) and `fix`."""
    try:
        return fn()
    except SystemExit as exc:
        raise _exited(exc, what)
    except Exception as exc:
        raise CliError(f"{what} raised {_describe(exc)}; {fix}")


# --------------------------------------------------------------------------- commands


def _print_report(report: Any) -> None:
    shown = report.render()
    if shown is None:  # render() printed it itself
        return
    if isinstance(shown, str):
        typer.echo(shown)
        return
    from rich.console import Console

    Console().print(shown)


def check_out(out: Path, option: str = "--out") -> None:
    """Fail before any work when `out` cannot become a writable directory: the folder is created and
    a file made in it (os.access says yes to root everywhere, and nothing about read-only mounts)."""
    if out.exists() and not out.is_dir():
        raise CliError(f"{option} {out} is a file; pass a directory (it is created if missing)")
    probe = out
    while not probe.exists() and probe != probe.parent:  # the nearest existing ancestor
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise CliError(f"{option} {out}: {probe} is a file, so the folder cannot be created; pass another directory")
    created = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise CliError(f"{option} {out} cannot be created or written ({_describe(exc)}); pass a directory you can "
                       "write to")
    finally:  # what the probe created goes again: a failed run leaves no empty folder behind
        for p in created:
            with contextlib.suppress(OSError):
                p.rmdir()


def _write_outputs(tm: Any, out: Path) -> list:
    check_out(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in (
            ("report.md", tm.report.to_markdown()),
            ("report.json", tm.report.to_json()),
            ("translated.py", tm.code),
            *_html(tm.report),
        ):
            target = out / name
            target.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
            written.append(target)
    except OSError as exc:
        raise CliError(f"cannot write into --out {out} ({_describe(exc)}); pass a writable directory")
    return written


def _html(report: Any) -> list:
    """[("report.html", page)] for a translator Report (the page reads its rows and summary)."""
    from translator.report import Report
    from translator.report.html import render_html

    return [("report.html", render_html(report))] if isinstance(report, Report) else []


def _report_json(report: Any) -> str:
    text = report.to_json()
    json.loads(text)  # one JSON document on stdout, or a bug here
    return text


def _verification_passed(report: Any) -> Optional[bool]:
    verification = getattr(report, "verification", None)
    if verification is None or getattr(verification, "ran", True) is False:  # --no-verify: nothing failed
        return None
    return bool(verification.passed)


def _squash(exc: BaseException, limit: int = 600) -> str:
    """A multi-line message as one line (--debug shows it whole)."""
    line = "; ".join(ln.strip().rstrip(":") for ln in str(exc).splitlines() if ln.strip())
    return line if len(line) <= limit else line[: limit - 30] + "... (--debug shows all)"


@contextlib.contextmanager
def _held_output(debug: bool):
    """Hold back what torch prints while translating (a failed torch.export prints its graph)."""
    if debug:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def _run_convert(script: Path, out: Optional[Path], options: dict, emit_kernels: Optional[Path] = None,
                 export_kernels: Optional[Path] = None, show: str = "table", debug: bool = False,
                 stdout: Any = None) -> int:
    from translator import api
    from translator.errors import TranslatorError
    from translator.progress import show_progress

    out = out if out is not None else Path("out") / script.stem
    check_out(out)
    for folder, option in ((emit_kernels, "--emit-kernels"), (export_kernels, "--export-kernels")):
        if folder is not None:
            check_out(folder, option)
    onnx = script.suffix.lower() == ".onnx"  # an ONNX file: inputs come from its input types
    with contextlib.nullcontext() if onnx else loaded_script(script) as module:
        model, inputs = (script, None) if onnx else build_model(module, script)
        try:
            with show_progress(show == "table" and sys.stderr.isatty()), _held_output(debug):
                tm = api.translate(model, inputs, name=script.stem, **options)
        except SystemExit as exc:  # the model's own code exited while translate() ran it
            raise _exited(exc, f"the model of {script} (run by translate())")
        except TranslatorError as exc:  # InputError, StrictError, CaptureError, BackendError, ...
            if debug:
                typer.echo(f"{type(exc).__name__}: {exc}", err=True)
            raise CliError(f"{type(exc).__name__}: {_squash(exc)}", EXIT_BAD_INPUT)

    if show == "table":
        _print_report(tm.report)
    emitted = []
    if emit_kernels is not None:  # first, so the reports written below link the kernel sources
        from translator.report.emit import emit_kernels as emit

        try:
            emitted = emit(tm, emit_kernels)[:1]
        except OSError as exc:
            raise CliError(f"cannot write into --emit-kernels {emit_kernels} ({_describe(exc)}); pass a writable directory")
        tm.report.kernel_sources = str(emitted[0].resolve())
    if export_kernels is not None:
        from translator.report.export import export_kernels as export

        try:
            emitted.append(export(tm, export_kernels))
        except OSError as exc:
            raise CliError(f"cannot write into --export-kernels {export_kernels} ({_describe(exc)}); pass a writable directory")
    written = _write_outputs(tm, out) + emitted
    if show == "json":
        typer.echo(_report_json(tm.report), file=stdout or sys.stdout)
    elif show == "table":
        typer.echo(f"wrote {', '.join(str(p) for p in written)}")
    if _verification_passed(tm.report) is False:
        typer.echo(
            f"{PROG}: error: verification failed: the translated model does not match eager PyTorch; "
            f"see {out / 'report.md'} (first diverging node) or rerun with --fallback-on-mismatch",
            err=True,
        )
        return EXIT_VERIFY_FAILED
    return EXIT_OK


CONVERT_EPILOG = """\b
Example:
  flydsl-translate convert models/mini_gpt.py --backend flysim --out out/gpt
  python -m translator convert model.py --json > report.json

\b
Exit codes:
  0  success
  1  verification failed (the files are still written)
  2  bad input: the script, its Model or inputs, an option, --strict
  3  internal error: a translator bug (rerun with --debug, report it)
"""


@app.command(epilog=CONVERT_EPILOG, short_help="Translate a model script (or .onnx), verify it, write the report.")
def convert(
    script: Annotated[Path, typer.Argument(help="Model script (defines Model, get_inputs(), get_init_inputs()) or an .onnx file.", show_default=False)],
    arch: Annotated[Arch, typer.Option(help="Target GPU: gfx942 (MI300X) or gfx950 (MI350X/MI355X).")] = Arch.gfx942,
    backend: Annotated[Backend, typer.Option(help="Where FlyDSL ops run: auto picks rocm when an AMD GPU is present.")] = Backend.auto,
    precision: Annotated[Precision, typer.Option(help="Compute precision of the FlyDSL kernels.")] = Precision.fp32,
    out: Annotated[Optional[Path], typer.Option(help="Output folder (default: out/<script stem>).", show_default=False)] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Fail (exit 2) if any op would stay in PyTorch.")] = False,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Compare with eager PyTorch on the example inputs.")] = True,
    fallback_on_mismatch: Annotated[
        bool, typer.Option("--fallback-on-mismatch", help="Run ops whose output diverges in PyTorch instead of failing.")
    ] = False,
    isa: Annotated[
        bool, typer.Option("--isa", help="Compile each FlyDSL kernel for --arch (no GPU) and add its ISA statistics to the report.")
    ] = False,
    emit_kernels: Annotated[
        Optional[Path], typer.Option("--emit-kernels", help="Write the FlyDSL kernel sources this model used (generated ones with a check script each) into this folder.", show_default=False)
    ] = None,
    export_kernels: Annotated[
        Optional[Path], typer.Option("--export-kernels", help="Write each compiled kernel as an object file and a C header (no Python needed to run them) plus manifest.json into this folder.", show_default=False)
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON on stdout (nothing else goes to stdout).")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors (no table, no progress).")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks, debug logs and torch's capture output.")] = False,
) -> None:
    """Translate the Model of SCRIPT (or an .onnx file), verify it, print the
    report and write report.md, report.json, report.html and translated.py."""
    if not debug:  # torch.export's capture chatter (dims specialized, ...) is for --debug only
        logging.getLogger("torch._export").setLevel(logging.ERROR)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        log = logging.getLogger("translator")
        log.addHandler(handler)
        log.setLevel(logging.DEBUG)
    options = dict(
        arch=arch.value,
        backend=backend.value,
        precision=precision.value,
        verify=verify,
        strict=strict,
        fallback_on_mismatch=fallback_on_mismatch,
        **({"isa": True} if isa else {}),  # off by default: compiling every kernel costs seconds
    )
    try:
        show = "json" if json_out else ("quiet" if quiet else "table")
        stdout = sys.stdout  # with --json, the JSON alone: whatever the user's script prints goes to stderr
        with contextlib.redirect_stdout(sys.stderr) if json_out else contextlib.nullcontext():
            code = _run_convert(script, out, options, emit_kernels, export_kernels, show, debug, stdout)
    except CliError as exc:
        if debug:
            traceback.print_exc()
        typer.echo(f"{PROG}: error: {exc.message}", err=True)
        raise typer.Exit(exc.exit_code)
    except Exception as exc:
        if debug:
            traceback.print_exc()
        typer.echo(
            f"{PROG}: internal error: {_describe(exc)}; this is a translator bug, rerun with --debug and report the traceback",
            err=True,
        )
        raise typer.Exit(EXIT_INTERNAL)
    raise typer.Exit(code)


@app.command()
def ops() -> None:
    """Print the table of supported ops (Markdown)."""
    from translator.report.ops_table import supported_ops_markdown

    typer.echo(supported_ops_markdown())


def main(argv: Optional[list] = None) -> int:
    """Console-script entry point; returns the exit code instead of calling sys.exit."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = typer.main.get_command(app)
    if not args:
        typer.echo(command.get_help(command.make_context(PROG, ["--help"], resilient_parsing=True)))
        return EXIT_OK
    try:
        code = command.main(args=args, prog_name=PROG, standalone_mode=False)
    except typer.TyperException as exc:  # usage errors: unknown option, bad --arch value, missing SCRIPT
        sub = f" {args[0]}" if args[0] in ("convert", "ops") else ""
        message = _one_line(exc.format_message()).replace("Value error, ", "")
        typer.echo(f"{PROG}: error: {message} (see `{PROG}{sub} --help`)", err=True)
        return getattr(exc, "exit_code", EXIT_BAD_INPUT) or EXIT_BAD_INPUT
    except typer.Abort:
        typer.echo(f"{PROG}: aborted", err=True)
        return 130
    return code if isinstance(code, int) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
