"""The example's LLaVA vision-tower path, against a stand-in ``transformers`` (not installed here).

The stand-in mirrors the small part of the transformers API the example uses (CLIPVisionConfig.
from_dict, CLIPVisionModel(config), CLIPVisionModel.from_pretrained(..., output_loading_info=True),
forward(pixel_values, output_hidden_states=True) -> .hidden_states). What these tests check is the
example's own logic: which files and tensor names it reads, that a missing weight is fatal rather
than silently random, and the CLIP normalisation and feature choice.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
PATCH = 2


def _load_model_module():
    spec = importlib.util.spec_from_file_location("wm_model_under_test", REPO / "examples" / "worldmodel" / "model.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeConfig(SimpleNamespace):
    @classmethod
    def from_dict(cls, d):
        return cls(hidden_size=d.get("hidden_size", 8), image_size=d.get("image_size", 4),
                   num_hidden_layers=d.get("num_hidden_layers", 2))


class FakeCLIPVisionModel(nn.Module):
    seen_pixels: list = []

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.vision_model: Any = nn.Module()        # embed and layers, set below
        self.vision_model.embed = nn.Linear(3 * PATCH * PATCH, config.hidden_size)
        self.vision_model.layers = nn.ModuleList(nn.Linear(config.hidden_size, config.hidden_size)
                                                 for _ in range(config.num_hidden_layers))

    def forward(self, pixel_values, output_hidden_states=False):
        FakeCLIPVisionModel.seen_pixels.append(pixel_values.detach().clone())
        n = pixel_values.shape[0]
        patches = nn.functional.unfold(pixel_values, PATCH, stride=PATCH).transpose(1, 2)
        x = self.vision_model.embed(patches)
        hs = [torch.cat([torch.zeros(n, 1, x.shape[-1]), x], dim=1)]
        for layer in self.vision_model.layers:
            hs.append(layer(hs[-1]))
        return SimpleNamespace(hidden_states=tuple(hs), pooler_output=hs[-1][:, 0])

    @classmethod
    def from_pretrained(cls, path, local_files_only=False, output_loading_info=False):
        assert local_files_only
        cfg = json.loads((Path(path) / "config.json").read_text())
        model = cls(FakeConfig.from_dict(cfg.get("vision_config", cfg)))
        state = torch.load(Path(path) / "pytorch_model.bin", weights_only=True)
        result = model.load_state_dict(state, strict=False)
        info = {"missing_keys": result.missing_keys, "unexpected_keys": result.unexpected_keys, "mismatched_keys": []}
        return (model, info) if output_loading_info else model


@pytest.fixture
def wm(monkeypatch):
    fake: Any = types.ModuleType("transformers")
    fake.CLIPVisionConfig = FakeConfig
    fake.CLIPVisionModel = FakeCLIPVisionModel
    monkeypatch.setitem(sys.modules, "transformers", fake)
    FakeCLIPVisionModel.seen_pixels = []
    return _load_model_module()


def reference_tower_state(seed: int = 3) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return FakeCLIPVisionModel(FakeConfig.from_dict({})).state_dict()


def llava_folder(root: Path, tower: dict[str, torch.Tensor], prefix: str = "vision_tower.",
                 sharded: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({
        "model_type": "llava", "vision_feature_layer": -2,
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 8, "image_size": 4,
                          "num_hidden_layers": 2}}))
    lm = {"language_model.model.embed_tokens.weight": torch.zeros(4, 4)}
    vision = {prefix + k: v for k, v in tower.items()}
    if sharded:
        # The language-model shard is not a valid file: reading it would fail the test.
        (root / "model-00001-of-00002.bin").write_bytes(b"not a checkpoint")
        torch.save(vision, root / "model-00002-of-00002.bin")
        weight_map = {**{k: "model-00001-of-00002.bin" for k in lm}, **{k: "model-00002-of-00002.bin" for k in vision}}
        (root / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    else:
        torch.save({**lm, **vision}, root / "pytorch_model.bin")
    return root


def test_llava_checkpoint_loads_only_the_tower_with_its_weights(wm, tmp_path):
    tower = reference_tower_state()
    enc = wm.ClipVisionEncoder(str(llava_folder(tmp_path / "llava", tower)))
    got = enc.tower.state_dict()
    assert got.keys() == tower.keys()
    assert all(torch.equal(got[k], tower[k]) for k in tower)
    assert enc.out_dim == 8 and enc.image_size == 4


def test_new_style_names_and_unsharded_files(wm, tmp_path):
    tower = reference_tower_state(5)
    enc = wm.ClipVisionEncoder(str(llava_folder(tmp_path / "new", tower, prefix="model.vision_tower.", sharded=False)))
    assert all(torch.equal(enc.tower.state_dict()[k], tower[k]) for k in tower)


def test_a_missing_tower_weight_is_fatal_not_random(wm, tmp_path):
    tower = reference_tower_state()
    del tower["vision_model.layers.1.weight"]
    with pytest.raises(SystemExit, match="partly random.*vision_model.layers.1.weight"):
        wm.ClipVisionEncoder(str(llava_folder(tmp_path / "partial", tower)))
    # A bare CLIP folder that lacks weights fails the same way.
    clip = tmp_path / "clip"
    clip.mkdir()
    (clip / "config.json").write_text(json.dumps({"model_type": "clip_vision_model", "hidden_size": 8,
                                                  "image_size": 4}))
    torch.save({}, clip / "pytorch_model.bin")
    with pytest.raises(SystemExit, match="partly random"):
        wm.ClipVisionEncoder(str(clip))
    # No weights at all in a LLaVA folder.
    empty = tmp_path / "empty"
    llava_folder(empty, reference_tower_state(), sharded=False)
    (empty / "pytorch_model.bin").unlink()
    with pytest.raises(SystemExit, match="no vision_tower"):
        wm.ClipVisionEncoder(str(empty))


def test_non_clip_towers_are_refused(wm, tmp_path):
    folder = llava_folder(tmp_path / "siglip", reference_tower_state())
    cfg = json.loads((folder / "config.json").read_text())
    cfg["vision_config"]["model_type"] = "siglip_vision_model"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SystemExit, match="supports CLIP towers"):
        wm.ClipVisionEncoder(str(folder))


def test_frames_are_resized_and_clip_normalised_and_features_are_llavas(wm, tmp_path):
    enc = wm.ClipVisionEncoder(str(llava_folder(tmp_path / "llava", reference_tower_state())))
    frames = torch.full((2, 3, 4, 4), 0.5)
    feats = enc(frames)
    mean = torch.tensor(wm.CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(wm.CLIP_STD).view(1, 3, 1, 1)
    assert torch.allclose(FakeCLIPVisionModel.seen_pixels[-1], (frames - mean) / std)
    # LLaVA's feature: penultimate hidden state, patch tokens only, averaged
    hs = enc.tower(pixel_values=(frames - mean) / std, output_hidden_states=True).hidden_states
    assert torch.allclose(feats, hs[-2][:, 1:].mean(dim=1)) and feats.shape == (2, 8)
    enc(torch.rand(1, 3, 2, 2))                      # smaller frames are resized to the tower's size
    assert FakeCLIPVisionModel.seen_pixels[-1].shape == (1, 3, 4, 4)
    # preprocessor_config.json overrides the statistics
    (tmp_path / "llava" / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5] * 3,
                                                                           "image_std": [0.5] * 3}))
    enc = wm.ClipVisionEncoder(str(tmp_path / "llava"))
    enc(frames)
    assert torch.allclose(FakeCLIPVisionModel.seen_pixels[-1], torch.zeros(2, 3, 4, 4))


def test_world_model_trains_on_the_frozen_tower(wm, tmp_path):
    path = llava_folder(tmp_path / "llava", reference_tower_state())
    model = wm.build_model("llava", str(path), frames=3, d_model=8, nhead=2, layers=1)
    assert not any(p.requires_grad for p in model.encoder.parameters())
    assert "encoder.mean" not in model.state_dict()   # statistics are not checkpointed weights
    loss = model(torch.rand(2, 3, 3, 4, 4))
    loss.backward()
    assert torch.isfinite(loss) and model.head.weight.grad is not None
