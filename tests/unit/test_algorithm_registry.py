"""The `algo` group comes from the algorithm modules: options, order, parameters, search space and config_hash
defaults. Adding an algorithm is one module: checked on a copy of the package with two modules added."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import resnet8ptq.config  # noqa: F401  (registers base_config)
from resnet8ptq.algorithms import AlgoConfig, options, parameter_defaults, steps_in_order

REPO = Path(__file__).resolve().parents[2]


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def test_the_options_are_every_combination_in_stage_order() -> None:
    """adaround, brecq and qdrop share the rounding stage: one of them at most."""
    assert steps_in_order() == ("cle", "adaround", "brecq", "qdrop", "bias_correction")
    rounding = [[], ["adaround"], ["brecq"], ["qdrop"]]
    expected = [
        [*first, *middle, *last]
        for first in ([], ["cle"])
        for middle in rounding
        for last in ([], ["bias_correction"])
    ]
    assert sorted(options().values()) == sorted(expected)
    assert list(options())[:6] == ["none", "cle", "adaround", "brecq", "qdrop", "bias_correction"]
    assert options()["cle_qdrop_bias_correction"] == ["cle", "qdrop", "bias_correction"]
    for name, steps in options().items():
        assert list(composed(f"algo={name}").algo.steps) == steps


def test_no_algo_yaml_is_kept_by_hand() -> None:
    """The group's options live in the ConfigStore, made from the modules: a YAML would shadow one."""
    assert not list((REPO / "conf" / "algo").glob("*.yaml"))


def test_the_search_space_offers_every_option() -> None:
    choice = composed("hydra/sweeper=search").hydra.sweeper.params.algo
    assert choice == f"choice({','.join(options())})"
    assert "adaround" in choice and "cle_adaround" in choice


def test_parameters_are_typed_and_belong_to_their_algorithm() -> None:
    cfg = composed("algo=cle_adaround", "algo.adaround_iterations=7")
    algo = OmegaConf.to_object(cfg.algo)
    assert isinstance(algo, AlgoConfig)
    assert algo.parameters("adaround").iterations == 7 and algo.parameters("cle") is None
    assert parameter_defaults() == {
        "algo.adaround_iterations": 1000,
        "algo.adaround_batch_size": 32,
        "algo.brecq_iterations": 2000,
        "algo.brecq_batch_size": 32,
        "algo.qdrop_iterations": 2000,
        "algo.qdrop_batch_size": 32,
        "algo.qdrop_drop": 0.5,
    }
    with pytest.raises(Exception, match="adaround_iterations"):
        composed("algo.adaround_iterations=many")  # the schema's type, at composition


DUMMY = '''
"""A test algorithm: scales nothing, says it ran."""
from dataclasses import dataclass

from resnet8ptq.algorithms.base import Algorithm, Context


@dataclass
class DummyParameters:
    strength: float = 0.5

    def __post_init__(self) -> None:
        if self.strength <= 0:
            raise ValueError("algo.dummy_strength: expected a positive number.")


class Dummy(Algorithm):
    NAME = "dummy"
    STAGE = 25
    Parameters = DummyParameters

    def apply(self, model, context: Context) -> dict[str, str]:
        return {"dummy_strength": f"{self.parameters.strength:g}"}
'''

ALTERNATIVE = """
from resnet8ptq.algorithms.base import Algorithm


class OtherRounding(Algorithm):
    NAME = "other"
    STAGE = 20  # adaround's stage: one or the other

    def apply(self, model, context):
        return {}
"""

PROBE = """
import json, sys
from pathlib import Path

import numpy as np
import onnx
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import resnet8ptq.config
from resnet8ptq.algorithms import AlgoConfig, Context, options, prepare
from resnet8ptq.tracking.identity import config_hash

with initialize_config_dir(config_dir=sys.argv[1], version_base="1.3"):
    cfg = compose("config", overrides=["algo=cle_dummy", "algo.dummy_strength=2"])
    search = compose("config", overrides=["hydra/sweeper=search"], return_hydra_config=True)
algo = OmegaConf.to_object(cfg.algo)
try:
    AlgoConfig(steps=["adaround", "other"])
    together = "accepted"
except ValueError as err:
    together = str(err)
try:
    AlgoConfig(steps=["dummy"], dummy_strength=0)
    bad = "accepted"
except ValueError as err:
    bad = str(err)
conv = onnx.helper.make_node("Conv", ["x", "w"], ["y"], name="conv")
graph = onnx.helper.make_graph(
    [conv], "g",
    [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 2, 2])],
    [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 2, 2])],
    [onnx.numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")],
)
source = Path(sys.argv[2]) / "tiny.onnx"
onnx.save(onnx.helper.make_model(graph), source)
context = Context(np.zeros((1, 1, 2, 2), np.float32), None)
prepared = prepare(algo, source, context, Path(sys.argv[2]) / "algo")
params = {"algo.steps": "[]", "backend": "onnx"}
print(json.dumps({
    "options": list(options()),
    "steps": algo.steps,
    "strength": algo.parameters("dummy").strength,
    "together": together,
    "bad": bad,
    "tags": prepared.tags,
    "choice": search.hydra.sweeper.params.algo,
    "same_hash": config_hash({**params, "algo.dummy_strength": "0.5"}, {}) == config_hash(params, {}),
    "other_hash": config_hash({**params, "algo.dummy_strength": "2.0"}, {}) != config_hash(params, {}),
}))
"""


@pytest.fixture(scope="module")
def with_two_new_modules(tmp_path_factory) -> dict:
    """A copy of the package with ``dummy.py`` (a new stage, one parameter) and ``other.py`` (an alternative
    to AdaRound) added to ``resnet8ptq/algorithms/``, and nothing else changed."""
    root = tmp_path_factory.mktemp("copy")
    shutil.copytree(REPO / "resnet8ptq", root / "resnet8ptq", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "resnet8ptq" / "algorithms" / "dummy.py").write_text(textwrap.dedent(DUMMY))
    (root / "resnet8ptq" / "algorithms" / "other.py").write_text(textwrap.dedent(ALTERNATIVE))
    probe = root / "probe.py"
    probe.write_text(PROBE)
    done = subprocess.run(
        [sys.executable, str(probe), str(REPO / "conf"), str(root)],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "HOME": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_new_module_is_an_option_in_its_stage(with_two_new_modules: dict) -> None:
    found = with_two_new_modules
    assert "dummy" in found["options"] and "cle_adaround_dummy_bias_correction" in found["options"]
    assert "other" in found["options"] and not any("adaround_other" in name for name in found["options"])
    assert "at most one algorithm per stage" in found["together"]
    assert "cle_dummy" in found["choice"]


def test_a_new_module_brings_its_parameters(with_two_new_modules: dict) -> None:
    found = with_two_new_modules
    assert found["steps"] == ["cle", "dummy"] and found["strength"] == 2.0
    assert found["bad"] == "algo.dummy_strength: expected a positive number."
    assert found["tags"] == {"algo.cle_pairs": "none found", "algo.dummy_strength": "2"}


def test_a_new_parameter_at_its_default_keeps_earlier_config_hashes(with_two_new_modules: dict) -> None:
    assert with_two_new_modules["same_hash"] and with_two_new_modules["other_hash"]
