"""Plans and records as YAML or JSON text, the same way everywhere they are printed."""

from __future__ import annotations

import json
from typing import Any


def _no_alias_dumper() -> Any:
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
