"""Options and steps shared by the commands that take a job spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import click

from ..errors import SpecError

BACKEND_CHOICE = click.Choice(["local", "docker", "kubernetes"])


def spec_options(func: Callable) -> Callable:
    """SPEC plus the flags that override spec fields."""
    decorators = [
        click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False, path_type=Path)),
        click.option("--set", "set_flags", multiple=True, metavar="KEY=VALUE",
                     help="Override a spec field, e.g. --set resources.shm=32Gi (repeatable)."),
        click.option("--nodes", type=int, default=None, help="Override `nodes`."),
        click.option("--image", "image_tag", default=None, help="Override `image.tag` (the image to run)."),
        click.option("--vendor", default=None, help="Override `image.vendor`."),
        click.option("-n", "--namespace", default=None, help="Override `kubernetes.namespace`."),
    ]
    for deco in reversed(decorators):
        func = deco(func)
    return func


def overrides_from(set_flags: tuple[str, ...], nodes: int | None, image_tag: str | None,
                   vendor: str | None, namespace: str | None) -> dict[str, Any]:
    from ..spec import parse_set_flags

    overrides = parse_set_flags(set_flags)
    for key, value in (("nodes", nodes), ("image.tag", image_tag), ("image.vendor", vendor),
                       ("kubernetes.namespace", namespace)):
        if value is not None:
            overrides[key] = value
    return overrides


def load(spec_path: Path, overrides: dict[str, Any]):
    """Load and validate the spec, then its vendor profile. The image is pinned to the digest the
    build record holds for its tag (see ``pin_image``); the note saying so goes to stderr, so a
    plan piped into kubectl stays clean."""
    from ..spec import load_spec
    from ..vendors import load_profile

    spec = load_spec(spec_path, overrides)
    note = pin_image(spec_path, spec)
    if note:
        click.echo(f"note: {note}", err=True)
    return spec, load_profile(spec.image.vendor)


# images.RECORD_FILE, spelled out so a spec without a build record never imports the build module.
_RECORD = (".wmctl", "images.json")


def pin_image(spec_path: Path, spec: Any) -> str | None:
    """Replace ``spec.image.tag`` with the ``repo@sha256:...`` that `wmctl build-image --push`
    recorded for that very tag next to the spec, so every node of every attempt runs the same
    bytes even if the tag is moved later. Returns the note to show, or None when nothing was
    pinned. A tag that already holds a digest (``--image repo@sha256:...``) is used as is: that
    is also how to run a tag as it stands on the registry instead of the recorded push."""
    tag = spec.image.tag
    if not tag or "@" in tag:
        return None
    record = Path(spec_path).resolve().parent.joinpath(*_RECORD)
    if not record.is_file():
        return None
    from ..images import pinned_ref

    ref = pinned_ref(Path(spec_path), spec.name, tag)
    if ref is None:
        return None
    spec.image.tag = ref
    return (f"image {tag} pinned to digest {ref} from the build record {record}; "
            "pass --image with a repo@sha256:... reference to run another")


def _no_alias_dumper():
    import yaml

    class NoAliasDumper(yaml.SafeDumper):
        """Plans are read by people and by kubectl: an object shared between two places must
        print twice, never as ``&id001`` / ``*id001``."""

        def ignore_aliases(self, data: Any) -> bool:
            return True

    return NoAliasDumper


def dump(data: Any, output: str) -> str:
    if output == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    import yaml

    if isinstance(data, list):
        return yaml.dump_all(data, Dumper=_no_alias_dumper(), sort_keys=False, allow_unicode=False, width=1000)
    return yaml.dump(data, Dumper=_no_alias_dumper(), sort_keys=False, allow_unicode=False, width=1000)


def plan_document(plan: Any, output: str) -> str:
    """What `render` and `submit --dry-run` print: for Kubernetes, manifests kubectl accepts."""
    if plan.backend == "kubernetes":
        if output == "json":
            return dump({"apiVersion": "v1", "kind": "List", "items": plan.resources}, "json")
        header = "".join(f"# {note}\n" for note in
                         [f"wmctl plan: run {plan.run}, attempt {plan.attempt}, spec {plan.spec_hash}", *plan.notes])
        return header + dump(plan.resources, "yaml")
    return dump(plan.to_dict(), output)


def write_out_dir(plan: Any, out_dir: Path, output: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    ext = "json" if output == "json" else "yaml"
    for i, res in enumerate(plan.resources):
        kind = str(res.get("kind", "resource")).lower()
        name = (res.get("metadata") or {}).get("name") or res.get("name") or (res.get("create") or {}).get("name") or str(i)
        path = out_dir / f"{i:02d}-{kind}-{name}.{ext}"
        path.write_text(dump(res, output), encoding="utf-8")
        written.append(path)
    return written


def require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise SpecError([(field, message)])


