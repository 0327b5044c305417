"""Command-line options shared by several commands, and their checks.

A bad option value is a usage error: the check raises ``typer.BadParameter`` and the command
line exits with status 2, naming the option (with a "did you mean" where one is close).
Checks import only the light parts of the library, so ``--help`` and completion stay fast.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import typer

ACT_QUANTS = ("auto", "bf16", "fp8", "mxfp4")


def did_you_mean(value: str, choices) -> str:
    close = difflib.get_close_matches(value.strip().lower(), [c.lower() for c in choices], n=3, cutoff=0.5)
    by_lower = {c.lower(): c for c in choices}
    return f" Did you mean {' or '.join(repr(by_lower[c]) for c in close)}?" if close else ""


def one_of(choices: tuple[str, ...]):
    """A check and a completer for an option taking one of ``choices``."""

    def check(value: str | None) -> str | None:
        if value is not None and value not in choices:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(choices)}."
                                     f"{did_you_mean(value, choices)}")
        return value

    def complete(incomplete: str) -> list[str]:
        return [c for c in choices if c.startswith(incomplete)]

    return {"callback": check, "autocompletion": complete}


def _arch_names() -> list[str]:
    from mxfp4conv.oracle.arch import names

    return names()


def _check_arch(value: str) -> str:
    from mxfp4conv.oracle.arch import ALIASES, ARCHS, names, normalise, platform_of, resolve_arch
    from mxfp4conv.errors import OracleError

    try:
        resolve_arch(value)
    except OracleError:
        # suggestions from the platform the name points at (an NVIDIA name never suggests an AMD
        # one), and all of one arch: the closest name's
        pool = names(platform_of(value))
        best = difflib.get_close_matches(normalise(value), pool, n=1, cutoff=0.5)
        if best:
            pool = [n for n in pool if ALIASES.get(n, n) == ALIASES.get(best[0], best[0])]
        close = did_you_mean(normalise(value), pool)
        raise typer.BadParameter(
            f"unknown arch {value!r}.{close} Known: {', '.join(ARCHS)}; "
            f"aliases: {', '.join(f'{a} ({c})' for a, c in ALIASES.items())}.") from None
    return value


def _complete_arch(incomplete: str) -> list[str]:
    return [a for a in _arch_names() if a.startswith(incomplete.lower())]


def arch_option():
    return typer.Option(..., "--arch", metavar="ARCH", callback=_check_arch, autocompletion=_complete_arch,
                        help="Target GPU arch: gfx942, gfx950, gfx1250, sm90, sm100, sm120, cpu, or a product "
                             "name (mi300x, mi308x, mi325x, mi355x, h100, h200, h20, h800, gh200, b200, gb200, "
                             "b300, gb300; sm_90a-style spellings too).")


def tp_option():
    return typer.Option(1, "--tp", "--tensor-parallel-size", "-tp", min=1, metavar="N",
                        help="Tensor-parallel ranks of each vLLM engine (vLLM's --tensor-parallel-size).")


def dp_option():
    return typer.Option(1, "--dp", "--data-parallel-size", "-dp", min=1, metavar="N",
                        help="Data-parallel engines (vLLM's --data-parallel-size); the MoE layers run over "
                             "tp x dp ranks, as vLLM flattens them.")


def ep_option():
    return typer.Option(False, "--ep", "--enable-expert-parallel",
                        help="Expert parallel over the tp x dp ranks instead of splitting the intermediate "
                             "size (vLLM's --enable-expert-parallel).")


PLACEMENTS = ("linear", "round_robin")  # mxfp4conv.oracle.parallel.PLACEMENTS


def placement_option():
    return typer.Option("linear", "--placement", "--expert-placement-strategy", metavar="P", **one_of(PLACEMENTS),
                        help="Expert placement over the EP ranks: linear or round_robin (vLLM's "
                             "--expert-placement-strategy; vLLM falls back to linear where it cannot keep "
                             "round_robin, and so does the plan).")


def all2all_option():
    from mxfp4conv.oracle.parallel import ALL2ALL_BACKENDS, DEFAULT_ALL2ALL

    return typer.Option(DEFAULT_ALL2ALL, "--all2all-backend", metavar="B", **one_of(ALL2ALL_BACKENDS),
                        help="vLLM's --all2all-backend (with EP and dp > 1 it decides whether round_robin "
                             "placement holds: deepep_low_latency or nixl_ep).")


def act_quant_option():
    return typer.Option("auto", "--act-quant", metavar="Q", **one_of(ACT_QUANTS),
                        help=f"Activation quantisation: {', '.join(ACT_QUANTS)} (auto: what the checkpoint "
                             "declares, else bf16).")


def _check_backend(value: str | None) -> str | None:
    if value is None:
        return None
    from mxfp4conv.errors import OracleError
    from mxfp4conv.oracle.backends import BACKENDS, MOE_BACKEND_STRINGS, parse_backend

    try:
        parse_backend(value)
    except OracleError:
        raise typer.BadParameter(
            f"unknown backend {value!r}.{did_you_mean(value, [*MOE_BACKEND_STRINGS, *BACKENDS])} Use a "
            f"vLLM --moe-backend string ({', '.join(MOE_BACKEND_STRINGS)}) or an Mxfp4MoeBackend name "
            f"({', '.join(BACKENDS)}).") from None
    return value


def _complete_backend(incomplete: str) -> list[str]:
    from mxfp4conv.oracle.backends import BACKENDS, MOE_BACKEND_STRINGS

    return [b for b in [*MOE_BACKEND_STRINGS, *BACKENDS] if b.startswith(incomplete)]


def backend_option():
    return typer.Option(None, "--backend", metavar="B", callback=_check_backend, autocompletion=_complete_backend,
                        help="Force a backend: a vLLM --moe-backend string or an Mxfp4MoeBackend name.")


MOE_WEIGHTS = ("int4_per_group_32",)  # mxfp4conv.oracle.backends.MOE_WEIGHTS


def moe_weight_option():
    return typer.Option(None, "--moe-weight", metavar="W", **one_of(MOE_WEIGHTS),
                        help="The server's --quantization-config.moe.weight: int4_per_group_32 (vLLM's "
                             "gfx942 int4 requantisation of Kimi-K3's experts at load; mxfp4conv cannot "
                             "write its bytes, so it needs --layout identity there).")


LAYOUTS = ("auto", "identity", "hopper_mma")  # mxfp4conv.oracle.select.KERNEL_LAYOUT_CHOICES


def vllm_option():
    return typer.Option("auto", "--vllm", metavar="R",
                        help="vLLM release whose MoE decision is modelled: 0.33 (vLLM 0.33.0), 0.34 "
                             "(vLLM 0.34.0) or auto (the vLLM installed here, else the newest "
                             "modelled). Another release uses the nearest older modelled one, and "
                             "says so.")


def say_release(value: str | None, quiet: bool = False) -> None:
    """One stderr line when ``--vllm`` (or the installed vLLM) is not a modelled release."""
    import sys

    from mxfp4conv.oracle.releases import resolve

    note = resolve(value).note
    if note and not quiet:
        sys.stderr.write(f"note: {note}\n")


def layout_option():
    return typer.Option("auto", "--layout", metavar="L", **one_of(LAYOUTS),
                        help="Layout of mxfp4conv's own (EMULATION) format: auto (hopper_mma on sm90 "
                             "with bf16 activations, else identity), identity (canonical bytes) or "
                             "hopper_mma.")


def _check_shard_size(value: str) -> str:
    from mxfp4conv.convert.plan import parse_size
    from mxfp4conv.errors import Mxfp4convError

    try:
        parse_size(value)
    except Mxfp4convError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


def shard_size_option():
    return typer.Option("5GB", "--shard-size", metavar="SIZE", callback=_check_shard_size,
                        help="Maximum output shard size in bytes or with a unit: 5GB, 500MB, 100KB.")


def revision_option():
    return typer.Option(None, "--revision", metavar="REV",
                        help="Hub revision (branch, tag or commit) of SOURCE; same as SOURCE@REV.")


def with_revision(source: str, revision: str | None, option: str = "--revision") -> str:
    """SOURCE and --revision as one source spec (``org/name@rev``)."""
    if revision is None:
        return source
    if Path(source).expanduser().exists():
        raise typer.BadParameter(f"{source} is a local directory; {option} applies to hub repo ids only.",
                                 param_hint=option)
    if "@" in source:
        raise typer.BadParameter(f"{source} already names a revision; give it once, either as "
                                 f"SOURCE@REV or with {option}.", param_hint=option)
    return f"{source}@{revision}"


SOURCE_HELP = "Checkpoint directory, or hub repo id org/name[@revision]."


def source_argument():
    return typer.Argument(..., metavar="SOURCE", help=SOURCE_HELP)
