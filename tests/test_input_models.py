"""A boolean where a number is expected is refused by every input model (servesim/input_models.py).

pydantic's lax mode reads ``true`` as 1: ``--set engine.max_num_seqs=true`` used to run with one sequence.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

import servesim
from servesim.cli import main
from servesim.errors import ConfigError

from test_cli import write_yaml
from test_robustness_cli import SMALL

SPEC = {"method": "eagle", "num_speculative_tokens": 2}


def _servesim_models() -> list[type[BaseModel]]:
    for info in pkgutil.walk_packages(servesim.__path__, "servesim."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    found, todo = set(), [BaseModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("servesim."):
                found.add(sub)
    return sorted(found, key=lambda cls: (cls.__module__, cls.__qualname__))


def _unguarded_numbers(schema, path="") -> list[str]:
    """Paths of ``int``/``float`` core schemas that no bool-refusing before-validator sits in front of."""
    import servesim.input_models as guards

    if isinstance(schema, (list, tuple)):
        return [p for i, item in enumerate(schema) for p in _unguarded_numbers(item, f"{path}[{i}]")]
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    if kind == "function-before" and schema["function"]["function"] in (guards._refuse_bool_for_int,
                                                                        guards._refuse_bool_for_float):
        inner = schema["schema"]
        return _unguarded_numbers({k: v for k, v in inner.items() if k != "type"}, path)
    if kind in ("int", "float"):
        return [f"{path}:{kind}"]
    return [p for key, value in schema.items() if key not in ("metadata", "serialization", "default")
            for p in _unguarded_numbers(value, f"{path}.{key}")]


def test_every_model_refuses_bools_for_its_numbers():
    models = _servesim_models()
    assert len(models) > 30  # the run config, workloads, cards, speculation, sweeps, validation cases
    for cls in models:
        if cls.__name__ == "InputModel":
            continue
        cls.model_rebuild()  # the defer_build models
        assert _unguarded_numbers(cls.__pydantic_core_schema__) == [], cls


@pytest.mark.parametrize("override, key, expected", [
    ("engine.max_num_seqs=true", "engine.max_num_seqs", "an integer"),
    ("engine.gpu_memory_utilization=yes", "engine.gpu_memory_utilization", "a number"),
    ("seed=true", "seed", "an integer"),
    ("tensor_parallel_size=on", "tensor_parallel_size", "an integer"),
    ("workload.rate=true", "workload.rate", "a number"),
    ("workload.prompt_tokens.low=true", "workload.prompt_tokens.low", "an integer"),
    ("slo.ttft_s=true", "slo.ttft_s", "a number"),
    ("deployment.replicas=true", "deployment.replicas", "an integer"),
    ("simulation.measure={after_completed: true}", "simulation.measure.after_completed", "an integer"),
    ("speculative_config.num_speculative_tokens=true", "speculative_config.num_speculative_tokens", "an integer"),
    ("speculative_config.temperature=true", "speculative_config.temperature", "a number"),
    ("speculative_config.num_speculative_tokens_per_batch_size=[[1, true, 2]]",
     "speculative_config.num_speculative_tokens_per_batch_size.0.1", "an integer"),
    ("speculative_config.acceptance={alpha: true}", None, None),
])
def test_run_refuses_a_bool_for_a_number(tmp_path, capsys, override, key, expected):
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "speculative_config": SPEC})
    code = main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--set", override])
    err = capsys.readouterr().err
    assert code == 2, err
    if key is None:  # acceptance is read when the run is wired: its own message, still one line
        assert err.startswith("servesim: error: ") and err.count("\n") == 1 and "alpha" in err, err
        return
    assert err == f"servesim: error: --set: {key}: expected {expected}, got a boolean\n"  # the value --set gave


def test_numbers_stay_lax_otherwise(tmp_path):
    from servesim.config.models import load_config

    cfg_path = write_yaml(tmp_path / "c.yaml", SMALL)
    cfg, _ = load_config(cfg_path, {"engine.max_num_seqs": "12", "engine.gpu_memory_utilization": 1,
                                    "workload.rate": 3, "roofline.mode": "ideal"})
    assert cfg.engine.max_num_seqs == 12 and isinstance(cfg.engine.max_num_seqs, int)
    assert cfg.engine.gpu_memory_utilization == 1.0 and isinstance(cfg.engine.gpu_memory_utilization, float)
    assert cfg.workload.rate == 3.0 and cfg.roofline.mode == "ideal"
    assert cfg.engine.enable_chunked_prefill is True  # bool fields take bools, of course


def test_speculative_config_option_refuses_a_bool(tmp_path, capsys):
    cfg = write_yaml(tmp_path / "c.yaml", SMALL)
    code = main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot",
                 "--speculative-config", '{"method": "eagle", "num_speculative_tokens": true}'])
    assert code == 2
    key = "speculative_config.num_speculative_tokens"
    expected = f"servesim: error: --speculative-config: {key}: expected an integer, got a boolean\n"
    assert capsys.readouterr().err == expected


def _card(name: str) -> dict:
    return yaml.safe_load((Path(__file__).resolve().parent.parent / "hardware" / name).read_text())


@pytest.mark.parametrize("kind, card, field", [
    ("gpus", "h100-sxm.yaml", "memory_bandwidth_bytes_per_s"),
    ("gpus", "h100-sxm.yaml", "peak_flops_per_s.bf16"),
    ("models", "llama-3.1-8b.yaml", "num_hidden_layers"),
])
def test_cards_refuse_a_bool_for_a_number(tmp_path, kind, card, field):
    from servesim.cards.loading import load_hardware, load_model
    from servesim.config.overrides import set_dotted

    data = _card(f"{kind}/{card}")
    path = write_yaml(tmp_path / card, set_dotted(data, field, True))
    load = load_hardware if kind == "gpus" else load_model
    with pytest.raises(ConfigError) as info:
        load(str(path))
    expected = "an integer" if field == "num_hidden_layers" else "a number"
    assert str(info.value).endswith(f": {field}: expected {expected}, got a boolean")
    assert str(path) in str(info.value)


def test_workload_file_refuses_a_bool(tmp_path):
    from servesim.workload import load_workload_config

    path = write_yaml(tmp_path / "w.yaml", {"type": "poisson", "rate": 2.0, "num_requests": True,
                                            "prompt_tokens": {"type": "fixed", "value": 8},
                                            "output_tokens": {"type": "fixed", "value": 8}})
    with pytest.raises(ConfigError, match=r"w\.yaml: num_requests: expected an integer, got a boolean$"):
        load_workload_config(path)


def test_sweep_file_refuses_a_bool(tmp_path, capsys):
    write_yaml(tmp_path / "c.yaml", SMALL)
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "grid": {"engine.max_num_seqs": [8, True]}})
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "s.yaml (point engine.max_num_seqs=True): engine.max_num_seqs: expected an integer, got a boolean" in err
    sweep = write_yaml(tmp_path / "s.yaml", {"base": "c.yaml", "replications": True})
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"servesim: error: {sweep}: replications: expected an integer, got a boolean\n"


@pytest.mark.parametrize("override, key", [
    ("speculative_config.draft_pass_overhead_s=.inf", "speculative_config.draft_pass_overhead_s"),
    ("speculative_config.ngram_cpu_s_per_request=.inf", "speculative_config.ngram_cpu_s_per_request"),
    ("speculative_config.temperature=.inf", "speculative_config.temperature"),
    ("engine.activation_reserve_bytes=.inf", "engine.activation_reserve_bytes"),
    ("simulation.measure={until_s: .inf}", "simulation.measure.until_s"),
])
def test_run_refuses_an_infinite_number(tmp_path, capsys, override, key):
    # each of these ended in a traceback (OverflowError: cannot convert float infinity to integer) or ran
    cfg = write_yaml(tmp_path / "c.yaml", {**SMALL, "speculative_config": SPEC})
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot", "--set", override]) == 2
    assert capsys.readouterr().err == f"servesim: error: --set: {key}: Input should be a finite number (got inf)\n"


def test_cards_refuse_an_infinite_number(tmp_path):
    from servesim.cards.loading import load_hardware

    path = write_yaml(tmp_path / "gpu.yaml", {**_card("gpus/h100-sxm.yaml"), "step_overhead_s": float("inf")})
    with pytest.raises(ConfigError, match=r"gpu\.yaml: step_overhead_s: Input should be a finite number \(got inf\)$"):
        load_hardware(str(path))


@pytest.mark.parametrize("override, message", [
    ("engine.enable_prefix_caching=0", "engine.enable_prefix_caching: expected true or false (got 0)"),
    ('engine.enable_prefix_caching="off"', "engine.enable_prefix_caching: expected true or false (got 'off')"),
    ("engine.async_scheduling=1", "engine.async_scheduling: expected true or false (got 1)"),
])
def test_run_refuses_a_number_or_string_for_a_boolean(tmp_path, capsys, override, message):
    """pydantic's lax booleans read 0, 1 and "off" as false/true: as silent as true for a number."""
    from test_user_mistakes import refused_run

    _, err = refused_run(tmp_path, capsys, "--set", override)
    assert err == f"servesim: error: --set: {message}\n"


def test_whole_numbers_in_exponent_form_are_integers(tmp_path):
    """YAML 1.1 reads 1e2 (no dot) as a string, which an integer field refused; 1.5e1 is 15, 1.5 stays refused."""
    from servesim.config.models import load_config

    body = {**SMALL, "workload": {**SMALL["workload"], "num_requests": "1e2"}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(body).replace("'1e2'", "1e2"), encoding="utf-8")
    assert "num_requests: 1e2" in (tmp_path / "c.yaml").read_text()
    cfg, _ = load_config(tmp_path / "c.yaml")
    assert cfg.workload.num_requests == 100 and type(cfg.workload.num_requests) is int
    cfg, _ = load_config(tmp_path / "c.yaml", [("workload.num_requests", "1.5e1")])
    assert cfg.workload.num_requests == 15
    with pytest.raises(ConfigError, match="num_requests"):
        load_config(tmp_path / "c.yaml", [("workload.num_requests", "1.5")])


def test_numpy_booleans_are_booleans():
    """np.bool_ from pandas or numpy (a config built in Python) was refused by the strict boolean guard."""
    import numpy as np

    from servesim.config.models import SimConfig

    cfg = SimConfig.model_validate({**SMALL, "engine": {"enable_prefix_caching": np.bool_(False)}})
    assert cfg.engine.enable_prefix_caching is False


def test_a_long_wrong_value_is_cut_in_the_message(tmp_path) -> None:
    # a CSV trace given as a config was quoted back whole: 700 KB on one line
    from servesim.input_files import SHOWN_VALUE_CHARS, shown_value

    assert shown_value("short") == "'short'"
    long = "x" * 10_000
    assert shown_value(long) == "'" + "x" * (SHOWN_VALUE_CHARS - 4) + "... (a str of 10,000 characters)"
    assert shown_value(list(range(1000))).endswith("... (a list)")
    from servesim.cli import main

    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "2023-11-16 18:15:46.6805900,374,44\n" * 2000)
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["validate", str(trace), "--out", str(tmp_path / "o")]) == 2
    assert len(err.getvalue()) < 300 and err.getvalue().endswith(" characters))\n"), err.getvalue()
