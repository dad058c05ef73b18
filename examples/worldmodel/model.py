"""The field report's simplified world model: frozen vision encoder -> temporal transformer ->
linear head that predicts the next frame's features (the field report's simplified world model, step 3).

The report uses LLaVA's vision tower, d_model 1024, 8 heads, 4 layers in bf16. The defaults here
are tiny so that two CPU ranks train a few hundred steps in minutes; ``--vision-tower llava``
swaps in LLaVA's CLIP vision tower from a local folder (see ClipVisionEncoder).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn


class ConvEncoder(nn.Module):
    """A small conv net standing in for the vision tower: frames (N, 3, H, W) -> (N, out_dim)."""

    def __init__(self, out_dim: int = 64) -> None:
        super().__init__()
        self.out_dim = out_dim
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=5, stride=4, padding=2), nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(32, out_dim, kernel_size=3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.net(frames)


# OpenAI CLIP's pixel statistics (CLIPImageProcessor's defaults, which LLaVA-1.5 uses); a folder's
# preprocessor_config.json overrides them.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _weight_files(folder: Path) -> list[Path]:
    """The checkpoint's weight files, safetensors first; the index (if sharded) says which."""
    for index_name, single in (("model.safetensors.index.json", "model.safetensors"),
                               ("pytorch_model.bin.index.json", "pytorch_model.bin")):
        index = folder / index_name
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            # Only the shards that hold vision-tower tensors: a 7B checkpoint's language model is
            # most of its size and is never read.
            names = sorted({f for k, f in weight_map.items() if "vision_tower." in k})
            return [folder / n for n in names]
        if (folder / single).is_file():
            return [folder / single]
    return []


def _load_vision_tower_state(folder: Path) -> dict[str, torch.Tensor]:
    """The vision tower's tensors of a full LLaVA checkpoint, renamed to CLIPVisionModel's names.

    llava-hf checkpoints name them ``vision_tower.vision_model...``; transformers >= 4.52 saves
    ``model.vision_tower.vision_model...``. Both become ``vision_model...``.
    """
    state: dict[str, torch.Tensor] = {}
    for path in _weight_files(folder):
        if path.suffix == ".safetensors":
            from safetensors import safe_open   # a dependency of transformers

            with safe_open(str(path), framework="pt", device="cpu") as fh:
                for key in fh.keys():
                    if "vision_tower." in key:
                        state[key.split("vision_tower.", 1)[1]] = fh.get_tensor(key)
        else:
            shard = torch.load(path, map_location="cpu", weights_only=True)
            state.update({k.split("vision_tower.", 1)[1]: v for k, v in shard.items() if "vision_tower." in k})
    return state


class ClipVisionEncoder(nn.Module):
    """LLaVA's CLIP vision tower from a local folder (never downloads), frozen.

    ``path`` is either a full LLaVA checkpoint (e.g. llava-hf/llava-1.5-7b-hf: config.json has
    ``model_type: llava`` and a ``vision_config``) or a CLIP vision model folder. For LLaVA, the
    tower is built from ``vision_config`` and only its tensors are read from the checkpoint:
    ``CLIPVisionModel.from_pretrained`` on a LLaVA folder would build a default-sized tower and,
    with every name prefixed ``vision_tower.``, leave it randomly initialised with just a warning;
    ``LlavaForConditionalGeneration.from_pretrained(...).vision_tower`` would be correct but loads
    the whole 7B model on every rank to keep 0.3B of it. Any missing tower weight is an error.

    Frames are resized to the tower's input size and normalised with CLIP's mean and std, as
    LLaVA's image processor does. The per-frame feature is what LLaVA's projector consumes:
    the hidden state of ``vision_feature_layer`` (default -2, the penultimate layer), patch tokens
    only (CLS dropped, LLaVA's "default" strategy), averaged over patches.
    """

    def __init__(self, path: str) -> None:
        super().__init__()
        try:
            import transformers
        except ImportError as err:
            raise SystemExit("--vision-tower llava needs the 'transformers' package in the image "
                             "(pip install transformers), or use --vision-tower conv") from err
        folder = Path(path)
        if not folder.is_dir():
            raise SystemExit(f"--vision-tower-path {path!r} is not a folder; point it at a local copy of "
                             "the LLaVA checkpoint (e.g. llava-hf/llava-1.5-7b-hf) or its CLIP vision tower")
        try:
            config = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError) as err:
            raise SystemExit(f"--vision-tower-path {path!r}: no readable config.json ({err})") from err
        self.feature_layer = int(config.get("vision_feature_layer", -2))
        if "vision_config" in config and config.get("model_type") != "clip":
            vision_config = dict(config["vision_config"])
            kind = vision_config.get("model_type", "clip_vision_model")
            if kind != "clip_vision_model":
                raise SystemExit(f"{path}: the vision tower is {kind!r}; this example supports CLIP towers "
                                 "(LLaVA-1.5); use --vision-tower conv or a LLaVA-1.5 checkpoint")
            self.tower = transformers.CLIPVisionModel(transformers.CLIPVisionConfig.from_dict(vision_config))
            state = _load_vision_tower_state(folder)
            if not state:
                raise SystemExit(f"{path}: no vision_tower.* weights found (looked for model.safetensors, "
                                 "pytorch_model.bin and their .index.json); is the download complete?")
            result = self.tower.load_state_dict(state, strict=False)
            missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
        else:
            self.tower, info = transformers.CLIPVisionModel.from_pretrained(
                path, local_files_only=True, output_loading_info=True)
            missing = list(info.get("missing_keys", [])) + [str(k) for k in info.get("mismatched_keys", [])]
            unexpected = list(info.get("unexpected_keys", []))
        # position_ids is a constant arange buffer, saved by some transformers versions only.
        missing = [k for k in missing if not k.endswith("position_ids")]
        if missing:
            raise SystemExit(f"{path}: the vision tower would be partly random: {len(missing)} weight(s) missing "
                             f"from the checkpoint, e.g. {', '.join(missing[:3])}; refusing to train on it")
        if [k for k in unexpected if not k.endswith("position_ids")]:
            print(f"note: {path}: ignoring {len(unexpected)} vision-tower tensor(s) the model does not use",
                  file=sys.stderr, flush=True)
        self.out_dim = int(self.tower.config.hidden_size)
        self.image_size = int(self.tower.config.image_size)
        mean, std = CLIP_MEAN, CLIP_STD
        pre = folder / "preprocessor_config.json"
        if pre.is_file():
            spec = json.loads(pre.read_text())
            mean, std = tuple(spec.get("image_mean", mean)), tuple(spec.get("image_std", std))
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """frames (N, 3, H, W) in [0, 1] -> (N, hidden_size)."""
        if frames.shape[-1] != self.image_size or frames.shape[-2] != self.image_size:
            # CLIP's processor resizes with bicubic; bicubic overshoots, hence the clamp.
            frames = nn.functional.interpolate(frames, size=(self.image_size, self.image_size), mode="bicubic",
                                               align_corners=False).clamp_(0.0, 1.0)
        pixels = (frames - self.mean.to(frames.dtype)) / self.std.to(frames.dtype)
        out = self.tower(pixel_values=pixels, output_hidden_states=True)
        return out.hidden_states[self.feature_layer][:, 1:].mean(dim=1)


class WorldModel(nn.Module):
    def __init__(self, encoder: nn.Module, frames: int, d_model: int = 64, nhead: int = 4,
                 layers: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.encoder = encoder
        for p in self.encoder.parameters():   # frozen, as in the report
            p.requires_grad_(False)
        feat = int(encoder.out_dim)
        self.proj = nn.Linear(feat, d_model)
        self.pos = nn.Parameter(torch.zeros(1, frames, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=4 * d_model, dropout=dropout,
                                           batch_first=True)
        self.temporal = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, feat)
        mask = torch.triu(torch.full((frames, frames), float("-inf")), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def train(self, mode: bool = True) -> WorldModel:
        super().train(mode)
        self.encoder.eval()   # frozen: no dropout / batch-norm updates in the tower
        return self

    def features(self, clips: torch.Tensor) -> torch.Tensor:
        b, t = clips.shape[:2]
        with torch.no_grad():
            return self.encoder(clips.flatten(0, 1)).reshape(b, t, -1)

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        """clips (B, T, 3, H, W) in [0, 1] -> MSE of predicted vs actual next-frame features."""
        feats = self.features(clips)
        t = feats.shape[1]
        x = self.proj(feats) + self.pos[:, :t]
        x = self.temporal(x, mask=self.causal_mask[:t, :t], is_causal=True)
        pred = self.head(x[:, :-1])
        return nn.functional.mse_loss(pred.float(), feats[:, 1:].float())


def build_model(vision_tower: str, vision_tower_path: str | None, frames: int, d_model: int, nhead: int,
                layers: int, feat_dim: int = 64) -> WorldModel:
    if vision_tower == "llava":
        if not vision_tower_path:
            raise SystemExit("--vision-tower llava needs --vision-tower-path PATH (a local folder; "
                             "nothing is downloaded)")
        encoder: nn.Module = ClipVisionEncoder(vision_tower_path)
    else:
        encoder = ConvEncoder(feat_dim)
    return WorldModel(encoder, frames=frames, d_model=d_model, nhead=nhead, layers=layers)
