"""The Spyre plugin's model registry, through the plugin's own configuration step, without
weights: ``hil registry``.

sendnn-inference 2.x declares the models a Spyre card serves in its registry
(``sendnn_inference/config/model_configs.yaml``): per model an architecture (model_type,
layer count, hidden size, vocabulary, heads), and per tensor-parallel size, context and batch
a device configuration (a block override, the batch TKV limit and the runtime's ``FLEX_*``
variables), which its model configurator applies when an engine starts on a card. On a card
host that happens in the engine itself; the harness does not interfere. Here no card and no
full weights are at hand, so this module builds each registered model's HF config from the
registry's own architecture (no weights: a ``config.json`` alone), lets vLLM make its engine
configuration from it (``EngineArgs(load_format="dummy", skip_tokenizer_init=True)``), and asks
the plugin's registry which entry applies and its configurator what it sets, as the plugin
does at engine start. Each row then checks that the configurator applied exactly what the
entry declares (the block override on vLLM's cache configuration, every variable in the
environment): a registry or configurator that drops a setting fails its row.

A lab's own model (a folder with its ``config.json``) is matched the same way against the
registry for the shapes it is served in (``--tp``, ``--max-model-len``, ``--max-num-seqs``).
Runs in the default stack's environment, where sendnn-inference is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.scenario.model_folder import ModelFolderError, check_config_file
from harness.staging.staged_report import StagedReport

PLUGIN = "sendnn_inference"
TKV_LIMIT_ENV = "VLLM_DT_MAX_BATCH_TKV_LIMIT"


@dataclass
class RegistryRow:
    """One registered shape of one model, and what the plugin's configurator did with it."""

    entry: str  # the registry entry whose shape this is (or the lab's model folder)
    tp: int
    max_model_len: int
    max_num_seqs: int
    matched: str | None = None  # the entry the plugin's registry matched, None: none
    declared_blocks: int | None = None
    declared_env: dict[str, str] = field(default_factory=dict)
    applied_blocks: int | None = None
    applied_env: dict[str, str] = field(default_factory=dict)
    problem: str | None = None  # why the row fails: settings not as declared
    note: str | None = None  # why the row could not be built here, or what else it shows

    @property
    def tkv_limit(self) -> str | None:
        return self.applied_env.get(TKV_LIMIT_ENV)

    def judge(self) -> None:
        """Set ``problem`` where the configurator did not apply what the entry declares."""
        if self.problem is not None or self.note is not None:
            return
        if self.matched is None:
            self.problem = "the plugin's registry matched no entry for this shape"
            return
        if self.matched != self.entry and not Path(self.entry).is_dir():
            # Two entries of one architecture: the registry serves the first; what counts is
            # whether this entry's settings are what the engine gets.
            self.note = (f"the registry matched {self.matched!r} (the same architecture),"
                         " whose settings are this entry's")
        if self.applied_blocks != self.declared_blocks:
            self.problem = ((f"the registry matched {self.matched!r}: " if self.note else "")
                            + f"the entry declares num_gpu_blocks_override {self.declared_blocks},"
                            f" the configurator applied {self.applied_blocks}")
            return
        for key, value in self.declared_env.items():
            if self.applied_env.get(key) != value:
                self.problem = ((f"the registry matched {self.matched!r}: " if self.note else "")
                                + f"the entry declares {key}={value}, the configurator applied"
                                f" {self.applied_env.get(key)!r}")
                return

    @property
    def verdict(self) -> str:
        if self.problem:
            return f"NOT AS DECLARED: {self.problem}"
        return f"as declared ({self.note})" if self.note and self.matched else (
            self.note or "as declared")


def architectures_for(model_type: str) -> list[str]:
    """The model class transformers names for ``model_type`` (a causal LM, else an
    image-text-to-text model): what a checkpoint's ``config.json`` says in ``architectures``."""
    from transformers.models.auto import modeling_auto  # deferred: a heavy import

    for table in ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"):
        name = getattr(modeling_auto, table, {}).get(model_type)
        if name:
            return [name]
    raise ValueError(f"transformers names no causal or image-text model for model_type"
                     f" {model_type!r}")


def hf_config(architecture: Any) -> dict[str, Any]:
    """The HF config of a registry architecture pattern: its model type and attributes, the
    model class transformers names for it, in bfloat16 as the registered checkpoints."""
    attributes = dict(architecture.attributes)
    return {"model_type": architecture.model_type, **attributes,
            "architectures": architectures_for(architecture.model_type),
            "torch_dtype": "bfloat16"}


@contextmanager
def kept_environment() -> Iterator[None]:
    """The configurator writes its variables into ``os.environ``: each row starts from the
    environment as it was, and leaves it so."""
    before = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def _engine_config(model_dir: Path, tp: int, max_model_len: int, max_num_seqs: int) -> Any:
    from vllm.engine.arg_utils import EngineArgs  # deferred: a heavy import

    args = EngineArgs(model=str(model_dir), skip_tokenizer_init=True, load_format="dummy",
                      tensor_parallel_size=tp, max_model_len=max_model_len,
                      max_num_seqs=max_num_seqs, enforce_eager=True)
    return args.create_engine_config()


def configure_row(registry: Any, row: RegistryRow, model_dir: Path,
                  declared: Any | None) -> RegistryRow:
    """Run the plugin's registry and configurator on the engine configuration vLLM makes of
    ``model_dir`` in ``row``'s shape; record what was matched and applied, and judge it."""
    if declared is not None:
        row.declared_blocks = declared.num_gpu_blocks_override
        row.declared_env = {k: str(v) for k, v in declared.env_vars.items()}
    with kept_environment():
        for key in row.declared_env:  # the entry's own values, not an inherited one
            os.environ.pop(key, None)
        try:
            vllm_config = _engine_config(model_dir, row.tp, row.max_model_len, row.max_num_seqs)
            configurator = registry.get_configurator_for_runtime(vllm_config)
            if configurator is not None:
                row.matched = configurator.model_config.name
                summary = configurator.configure(vllm_config)
                row.applied_env = {k: str(v.applied) for k, v in summary.env_vars.items()}
                row.applied_env.update({k: os.environ[k] for k in row.declared_env
                                        if k in os.environ})
                row.applied_blocks = vllm_config.cache_config.num_gpu_blocks_override
        except Exception as e:  # a config vLLM cannot make without the checkpoint: said
            row.note = f"not built here: {type(e).__name__}: {_last_line(e)}"
    row.judge()
    return row


def _last_line(e: BaseException) -> str:
    """The last informative line of an exception's message."""
    lines = [line.strip() for line in str(e).splitlines()
             if line.strip() and not line.strip().startswith("For further information")]
    return lines[-1] if lines else repr(e)


def _sizes(configs: Any) -> list[int]:
    return sorted({cb.tp_size for cb in configs})


def shapes_problem(known: Mapping[str, Any], models: list[str], tp: int | None = None,
                   max_model_len: int | None = None,
                   max_num_seqs: int | None = None) -> str | None:
    """Why the registry (``known``: the plugin's entries by name) has no shape to table for
    these arguments, or None: a ``--tp`` none of its decoder shapes has (the sizes are the
    registry's own), a registered model without a shape at that size, a name neither
    registered nor a folder, a folder whose config.json is missing or not a checkpoint's,
    or without the shape it is served in. Judged before any row is built or file written."""
    sizes = _sizes(cb for m in known.values() for cb in m.continuous_batching_configs)
    if tp is not None and tp not in sizes:
        return (f"--tp {tp}: the plugin's registry has no decoder shape of tensor-parallel size"
                f" {tp}; its sizes: {', '.join(map(str, sizes))}; give one of them, or leave"
                " --tp out for all")
    for name in models:
        if not name.strip():
            return (f"--model {name!r} names no model; name a registered model or a model"
                    " folder, or leave --model out for every registered decoder")
        folder = Path(name)
        if folder.is_dir():
            config = folder / "config.json"
            if not config.is_file():
                return (f"--model {name}: the folder has no config.json, which the registry"
                        " matches a model by; copy the checkpoint's config.json into it")
            try:
                check_config_file(config)
            except ModelFolderError as e:
                return f"--model: {e}"
            if None in (tp, max_model_len, max_num_seqs):
                return (f"{name} is a model folder: give --tp, --max-model-len and"
                        " --max-num-seqs, the shape it is served in")
            continue
        if name not in known:
            return (f"{name!r} is not in the plugin's registry, nor a model folder; registered:"
                    f" {', '.join(known)}")
        own = _sizes(known[name].continuous_batching_configs)
        if not own:
            return (f"{name!r} has no decoder shape in the plugin's registry (no"
                    " continuous-batching configuration) to table; name a decoder")
        if tp is not None and tp not in own:
            return (f"--tp {tp}: {name!r} has no registered shape of tensor-parallel size {tp};"
                    f" its sizes: {', '.join(map(str, own))}; give one of them, or leave --tp"
                    " out for all")
    return None


def registry_rows(models: list[str] | None = None, tp: int | None = None,
                  max_model_len: int | None = None,
                  max_num_seqs: int | None = None) -> list[RegistryRow]:
    """Every registered decoder shape of ``models`` (registry names; all when None), each run
    through the plugin's configuration step; a model folder among ``models`` is matched in
    the shape the three numbers give."""
    registry = plugin_registry()
    known = registry._models  # the plugin's own entries, by name
    if problem := shapes_problem(known, models or [], tp, max_model_len, max_num_seqs):
        raise ValueError(problem)
    rows: list[RegistryRow] = []
    for name in models or [n for n, m in known.items() if m.continuous_batching_configs]:
        if Path(name).is_dir():
            rows.append(configure_row(registry, RegistryRow(name, int(tp), int(max_model_len),
                                                            int(max_num_seqs)),
                                      Path(name), None))
            continue
        model = known[name]
        with tempfile.TemporaryDirectory(prefix="hil-registry-") as folder:
            try:
                (Path(folder) / "config.json").write_text(json.dumps(hf_config(model.architecture)))
            except ValueError as e:
                for cb in model.continuous_batching_configs:
                    rows.append(RegistryRow(name, cb.tp_size, cb.max_model_len, cb.max_num_seqs,
                                            note=f"not built here: {e}"))
                continue
            for cb in model.continuous_batching_configs:
                if tp is not None and cb.tp_size != tp:
                    continue
                row = RegistryRow(name, cb.tp_size, cb.max_model_len, cb.max_num_seqs)
                rows.append(configure_row(registry, row, Path(folder), cb.device_config))
    return rows


def format_rows(rows: list[RegistryRow]) -> str:
    """The rows as a Markdown table."""
    lines = ["| entry | TP | context | batch | matched | block override | batch TKV limit |"
             " other variables | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        other = ", ".join(f"{k}={v}" for k, v in r.applied_env.items() if k != TKV_LIMIT_ENV)
        lines.append(f"| {r.entry} | {r.tp} | {r.max_model_len} | {r.max_num_seqs} |"
                     f" {r.matched or '-'} | {r.applied_blocks if r.applied_blocks is not None else '-'}"
                     f" | {r.tkv_limit or '-'} | {other or '-'} | {r.verdict} |")
    return "\n".join(lines)


def plugin_registry() -> Any:
    """The plugin's model registry (its entries in ``_models``, by name)."""
    from sendnn_inference.config.model_registry import get_model_registry  # deferred: heavy

    return get_model_registry()


def plugin_problem() -> str | None:
    """Why the plugin's registry cannot be asked alone in this process, or None."""
    import importlib.util

    if importlib.util.find_spec(PLUGIN) is None:
        return f"{PLUGIN} is not installed in this environment; run ./setup.sh"
    # vLLM's CPU platform makes the engine configuration; the plugin is asked by name.
    os.environ["VLLM_PLUGINS"] = ""
    from vllm.platforms import current_platform  # deferred: a heavy import

    if type(current_platform).__module__.startswith(PLUGIN):
        return (f"vLLM runs the {PLUGIN} platform in this process (something imported it"
                " before the command ran), which applies the registry itself while vLLM makes"
                " the configuration; run with VLLM_PLUGINS=\"\" so that vLLM's CPU platform"
                " makes it and the plugin's registry is asked alone")
    return None


def registry_command(args: argparse.Namespace, extra: list[str]) -> int:
    """``hil registry``: the table on stdout and in REPORTS_DIR/registry/; exit 1 where a
    row's settings are not the entry's, 2 for a bad argument or no plugin (nothing written)."""
    if problem := plugin_problem():
        print(f"hil registry: {problem}", file=sys.stderr)
        return 2
    try:
        rows = registry_rows(args.model or None, args.tp, args.max_model_len, args.max_num_seqs)
    except ValueError as e:  # refused before any row was built: nothing written
        print(f"hil registry: {e}; nothing was written", file=sys.stderr)
        return 2
    if not rows:  # shapes_problem leaves none; an empty table would pass for a checked one
        print("hil registry: no registered shape to table; nothing was written (an earlier"
              f" registry.md stays as it was in {Path(args.reports_dir) / 'registry'})",
              file=sys.stderr)
        return 2
    table = format_rows(rows)
    print(table)
    staged = write_registry(Path(args.reports_dir) / "registry", table, rows)
    failed = [r for r in rows if r.problem]
    built = [r for r in rows if r.matched or r.problem]
    print(f"hil registry: {len(rows)} shape(s), {len(built)} built through the plugin's"
          f" configuration step, {len(failed)} not as declared; {staged.line}")
    return 1 if failed else 0


def write_registry(out: Path, table: str, rows: list[RegistryRow]) -> StagedReport:
    """registry.md and registry.json into ``out``, staged and published together (a run
    stopped while writing leaves the earlier ones as they were; the command refuses an empty
    table before it writes anything)."""
    with StagedReport(out, "registry", "registry.md") as staged:
        (staged.staging / "registry.md").write_text(table + "\n")
        (staged.staging / "registry.json").write_text(json.dumps([asdict(r) for r in rows],
                                                                 indent=1))
        staged.complete()
    return staged


def add_registry_parser(sub: Any, root: Path) -> None:
    """``hil registry``'s parser (the Spyre kind's command, ``KindHooks.commands``)."""
    p = sub.add_parser("registry", help="which entry of the Spyre plugin's model registry applies"
                       " to each registered model and shape, and what its configurator sets"
                       " (no card, no weights)")
    p.add_argument("--model", action="append", default=[], metavar="NAME_OR_FOLDER",
                   help="a registered model name, or a model folder with its config.json"
                   " (repeatable; default every registered decoder)")
    from harness.plugin.options import cli_type  # deferred: the kind registry imports this

    p.add_argument("--tp", type=cli_type("count", "--tp"), default=None, help="only this"
                   " tensor-parallel size, one of the registry's (a folder's: the one it is"
                   " served at)")
    p.add_argument("--max-model-len", type=cli_type("count", "--max-model-len"), default=None,
                   help="a folder's context")
    p.add_argument("--max-num-seqs", type=cli_type("count", "--max-num-seqs"), default=None,
                   help="a folder's batch")
    p.add_argument("--reports-dir", default=str(root / "reports"))
    p.set_defaults(func=registry_command)

