"""``basin deployment``: what a deployment is made of and where each of its
costs and capacities comes from (a measured profile or the roofline)."""

from __future__ import annotations

import json
from typing import Any

import typer

app = typer.Typer(help="Deployments: shipped, from a file, or described as model x GPU x tp (docs/deployments.md).",
                  no_args_is_help=True)


def deployment_info(name_or_file: str, host_ratio: float | None = None) -> dict[str, Any]:
    """Everything ``show`` prints, as plain values."""
    from basin.catalog import cache_capacity, critical_rate, load_deployment, load_hardware, with_host_ratio
    from basin.catalog.hardware import hardware_origin
    from basin.catalog.roofline import compare_to_measured, describe, parse_hardware_name

    dep = with_host_ratio(load_deployment(name_or_file), host_ratio)
    hw = load_hardware(dep.hardware)
    cap = cache_capacity(dep, hw)
    parsed = parse_hardware_name(dep.hardware)
    info: dict[str, Any] = {
        "deployment": dep.name, "shape": dep.shape, "hardware": dep.hardware, "host_ratio": dep.host_ratio,
        "router": dep.router,
        "capacity": {"gpu_prefix_cache_tokens": cap.gpu_tokens, "host_tier_tokens": cap.host_tokens,
                     "effective_cache_tokens": cap.effective_tokens,
                     "decode_kv_tokens": dep.decode_instances * hw.decode.kv_tokens},
    }
    if parsed is None:
        info["source"] = "measured"
        origin = hardware_origin(dep.hardware)
        dump = hw.model_dump()
        info["figures"] = [{"field": f"{section}.{k}" if section else k, "value": v, "origin": origin}
                           for section, part in (("prefill", dump["prefill"]), ("decode", dump["decode"]),
                                                 ("", {k: dump[k] for k in ("page_tokens", "transfer_s",
                                                                              "itl_slo_s")}))
                           for k, v in part.items()]
    else:
        d = describe(*parsed)
        info["source"] = d.source
        info["model"], info["gpu"], info["tp"] = d.model.name, d.gpu.name, d.tp
        info["gpus"] = d.tp * (dep.prefill_instances + dep.decode_instances)
        info["figures"] = [{"field": f.field, "value": f.value, "origin": f.origin} for f in d.figures]
        info["roofline_vs_measured"] = [{"field": f, "roofline": a, "measured": b, "ratio": r}
                                        for f, a, b, r in compare_to_measured(d)]
    crit = critical_rate(dep, "terminal-bench")
    info["critical_rate"] = None if crit is None else {"per_min": crit.per_min, "origin": crit.origin}
    return info


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3g}"
    return "-" if v is None else f"{v:,}" if isinstance(v, int) else str(v)


@app.command("show")
def show(
    name_or_file: str = typer.Argument(..., help="A shipped deployment, a YAML file (hardware: or model:/gpu:/tp:) "
                                                 "or a shape such as 2P4D-llama-3.1-8b@h100-sxm."),
    host_ratio: float = typer.Option(None, "--host-ratio", help="Override the host tier (0: GPU-only)."),
    as_json: bool = typer.Option(False, "--json", help="Print as JSON."),
) -> None:
    """Print a deployment's costs and capacities and where each figure came from.

    Example: basin deployment show llama70b-h200-1p3d
    """
    info = deployment_info(name_or_file, host_ratio)
    if as_json:
        from basin.jsonvalues import json_value

        typer.echo(json.dumps(json_value(info), indent=2))
        return
    c = info["capacity"]
    head = f"{info['deployment']}: {info['shape']} on {info['hardware']}"
    if "model" in info:
        head += f" ({info['model']} x {info['gpu']} x tp {info['tp']}, {info['gpus']} GPUs)"
    lines = [head, f"  costs from: {info['source']}"
             + (" profile" if info["source"] != "roofline" else " (model x GPU; docs/deployments.md)"),
             f"  cache: {c['gpu_prefix_cache_tokens']:,} GPU prefix tokens, host tier {c['host_tier_tokens']:,} "
             f"({info['host_ratio']:g}x), effective {c['effective_cache_tokens']:,}; decode KV "
             f"{c['decode_kv_tokens']:,} tokens; router {info['router']}"]
    crit = info["critical_rate"]
    lines.append(f"  critical rate (terminal-bench): {crit['per_min']:g}/min ({crit['origin']})" if crit else
                 "  critical rate (terminal-bench): none (no cliff profile; `basin profile` makes one)")
    lines.append("  per instance:")
    width = max(len(f["field"]) for f in info["figures"])
    lines += [f"    {f['field']:<{width}}  {_fmt(f['value']):>10}  {f['origin']}" for f in info["figures"]]
    if info.get("roofline_vs_measured"):
        lines.append("  the roofline against the measured profile (ratio = roofline / measured):")
        lines += [f"    {r['field']:<{width}}  {_fmt(r['roofline']):>10} vs {_fmt(r['measured']):>10}  "
                  f"{r['ratio']:.2f}" for r in info["roofline_vs_measured"]]
    typer.echo("\n".join(lines))


@app.command("list")
def list_() -> None:
    """The shipped deployments, models and GPUs."""
    from basin.catalog.gpus import gpu_names
    from basin.catalog.models import model_names
    from basin.paths import PROFILE_DIR

    deps = sorted(p.stem for p in (PROFILE_DIR / "deployments").glob("*.yaml"))
    typer.echo("deployments: " + ", ".join(deps))
    typer.echo("models: " + ", ".join(model_names()))
    typer.echo("gpus: " + ", ".join(gpu_names()))
