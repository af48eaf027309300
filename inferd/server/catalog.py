"""The models a many-model daemon serves: every GGUF file or model folder of `models_dir` under its file stem, the
`[models.NAME]` tables, and their aliases; each with the settings its engine is built from and an estimate of the
memory it takes once loaded.

A name is only ever looked up in this table: a request's `model` is never opened as a path, so a name outside the
table (`../x`, `/etc/passwd`, a file beside the folder) is simply not found.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import msgspec

from inferd.config import ConfigError, ModelSpec, Settings
from inferd.model.pull import cache_dir
from inferd.server.prompt_cache_files import FOLDER

MIB = 1 << 20
# the second and later parts of a split GGUF (name-00002-of-00003.gguf) belong to the first
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-\d{5}$")
WEIGHT_SUFFIXES = (".gguf", ".safetensors", ".bin")
BUDGET_SHARE = 0.8  # of the machine's (or cgroup's) memory, when memory_budget_mib is 0


@dataclass
class CatalogEntry:
    name: str
    path: str
    spec: ModelSpec
    settings: Settings  # the daemon's settings with this model's own applied (what its engine is built from)
    weights_bytes: int
    kv_bytes: int

    @property
    def estimate_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes


def scan_folder(folder: str) -> dict[str, str]:
    """{file stem: path} of the models in `folder`: GGUF files (a split one by its first part) and model folders
    (a config.json inside); hidden entries (the prompt cache's folder) are skipped."""
    root = Path(folder)
    if not root.is_dir():
        raise ConfigError(f"models_dir {folder} is not a folder")
    found: dict[str, str] = {}
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_file() and entry.suffix == ".gguf":
            stem = entry.stem
            split = _SPLIT.match(stem)
            if split is not None:
                if split["part"] != "00001":
                    continue
                stem = split["stem"]
            found[stem] = str(entry)
        elif entry.is_dir() and (entry / "config.json").is_file():
            found[entry.name] = str(entry)
    return found


def weights_bytes(path: str) -> int:
    """The bytes of a model's weights as its files hold them (every part of a split GGUF, every weight file of a
    folder): what loading it maps or copies into memory."""
    p = Path(path)
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and f.suffix in WEIGHT_SUFFIXES)
    split = _SPLIT.match(p.stem)
    if split is not None:
        return sum(f.stat().st_size for f in p.parent.glob(f"{split['stem']}-*-of-*.gguf"))
    return p.stat().st_size


def machine_memory_bytes() -> int:
    """The memory this process may use: the machine's, or its cgroup's limit when lower (a container, a systemd
    unit's MemoryMax)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_limit()
    return min(total, limit) if limit else total


def _cgroup_limit() -> int:
    """The tightest memory limit on the way from this process's cgroup up to the root (v2 memory.max, or v1's
    memory.limit_in_bytes); 0: none."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return 0
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            root, name = Path("/sys/fs/cgroup"), "memory.max"
        elif "memory" in controllers.split(","):
            root, name = Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"
        else:
            continue
        group = root / path.strip().lstrip("/")
        for folder in (group, *[p for p in group.parents if p.is_relative_to(root)]):
            try:
                text = (folder / name).read_text().strip()
            except OSError:
                continue
            if text.isdigit():
                limits.append(int(text))
    return min(limits, default=0)


def memory_budget_bytes(settings: Settings) -> int:
    if settings.memory_budget_mib:
        return settings.memory_budget_mib * MIB
    return int(machine_memory_bytes() * BUDGET_SHARE)


def model_settings(base: Settings, name: str, path: str, spec: ModelSpec, threads: int) -> Settings:
    """The daemon's settings with one model's applied; raises ConfigError naming the table when one is invalid."""
    fields = msgspec.structs.asdict(base)
    fields.update(
        model=path,
        served_model_name=name,
        threads=spec.threads or threads,
        models_dir="",
        models={},
        aliases={},
        lora_adapters=spec.lora_adapters,
        # the companions of a single-model daemon stay with it
        embedding_model="",
        rerank_model="",
        pooling="none",
        rerank_prompt="none",
        measure_bandwidth=False,
        # each model's prefix cache on disk in its own folder: a file is only ever read back by its own model
        prompt_cache_dir=str(Path(base.prompt_cache_dir or cache_dir(base.model_cache_dir) / FOLDER) / name),
    )
    for key in ("max_model_len", "kv_cache_dtype", "quantize", "generation_config", "override_generation_config"):
        value = getattr(spec, key)
        if value:
            fields[key] = value
    if spec.kv_cache_mib or spec.num_kv_blocks:
        fields.update(kv_cache_mib=spec.kv_cache_mib or base.kv_cache_mib, num_kv_blocks=spec.num_kv_blocks)
    try:
        return msgspec.convert(fields, Settings)
    except (msgspec.ValidationError, ValueError) as e:
        raise ConfigError(f"[models.{name}]: {e}") from None


def default_threads(settings: Settings, n_models: int) -> int:
    """A model's compute threads unless its table says: the daemon's `threads` when set, else the physical cores
    split evenly between the models that can be loaded at once, so that models busy together do not fight over
    the same cores."""
    from inferd.engine.engine import physical_cores

    return settings.threads or max(1, physical_cores() // max(1, n_models))


def most_loaded_at_once(estimates: list[int], budget: int) -> int:
    """How many models can be loaded together at most: the smallest ones first, within the budget."""
    total, count = 0, 0
    for size in sorted(estimates):
        total += size
        if total > budget:
            break
        count += 1
    return max(1, count)


def kv_bytes(settings: Settings) -> int:
    """The KV pool a model's engine allocates: kv_cache_mib, or num_kv_blocks blocks (sized from the model's
    shape only once loaded, so kv_cache_mib stands in for them until then)."""
    return settings.kv_cache_mib * MIB


def build_catalog(settings: Settings) -> dict[str, CatalogEntry]:
    """Every model the settings name, by name; raises ConfigError for a missing file, a duplicate name or an alias
    of nothing."""
    paths = scan_folder(settings.models_dir) if settings.models_dir else {}
    specs: dict[str, ModelSpec] = {name: ModelSpec() for name in paths}
    for name, spec in settings.models.items():
        if not spec.path and name not in paths:
            where = f"no file {name}.gguf or folder {name} in models_dir" if settings.models_dir else "no path"
            raise ConfigError(f"[models.{name}] has {where}")
        specs[name] = spec
        if spec.path:
            if not os.path.exists(spec.path):
                raise ConfigError(f"[models.{name}]: path {spec.path} does not exist")
            paths[name] = spec.path
    catalog: dict[str, CatalogEntry] = {}
    for name in sorted(specs):
        spec, path = specs[name], paths[name]
        own = model_settings(settings, name, path, spec, 0)  # threads are given out once every size is known
        catalog[name] = CatalogEntry(name, path, spec, own, weights_bytes(path), kv_bytes(own))
    together = most_loaded_at_once([e.estimate_bytes for e in catalog.values()], memory_budget_bytes(settings))
    threads = default_threads(settings, together)
    for entry in catalog.values():
        if not entry.spec.threads:
            entry.settings = msgspec.structs.replace(entry.settings, threads=threads)
    return catalog


def alias_table(settings: Settings, catalog: dict[str, CatalogEntry]) -> dict[str, str]:
    """{alias: name} from the `aliases` setting and each table's own aliases; an alias may not hide a model."""
    aliases: dict[str, str] = {}
    pairs = list(settings.aliases.items())
    pairs += [(alias, name) for name, entry in catalog.items() for alias in entry.spec.aliases]
    for alias, name in pairs:
        if name not in catalog:
            raise ConfigError(f"alias {alias!r} names {name!r}, which is not among the models ({', '.join(catalog)})")
        if alias in catalog and alias != name:
            raise ConfigError(f"alias {alias!r} is already the name of a model")
        if aliases.get(alias, name) != name:
            raise ConfigError(f"alias {alias!r} names both {aliases[alias]!r} and {name!r}")
        aliases[alias] = name
    return aliases
