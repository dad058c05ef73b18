"""The field report's simplified world model: frozen vision encoder -> temporal transformer ->
linear head that predicts the next frame's features (SEED_NOTES.md section 3, step 3).

The report uses LLaVA's vision tower, d_model 1024, 8 heads, 4 layers in bf16. The defaults here
are tiny so that two CPU ranks train a few hundred steps in minutes; ``--vision-tower llava``
swaps in a local CLIP vision tower.
"""

from __future__ import annotations

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


class ClipVisionEncoder(nn.Module):
    """LLaVA's CLIP vision tower loaded from a local folder (never downloads)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        try:
            import transformers
        except ImportError as err:
            raise SystemExit("--vision-tower llava needs the 'transformers' package in the image "
                             "(pip install transformers), or use --vision-tower conv") from err
        if not Path(path).is_dir():
            raise SystemExit(f"--vision-tower-path {path!r} is not a folder; point it at a local copy of "
                             "the LLaVA checkpoint (e.g. llava-hf/llava-1.5-7b-hf) or its CLIP vision tower")
        try:
            self.tower = transformers.CLIPVisionModel.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError):
            # A full LLaVA checkpoint: take its vision tower.
            llava = transformers.LlavaForConditionalGeneration.from_pretrained(path, local_files_only=True)
            self.tower = llava.vision_tower if hasattr(llava, "vision_tower") else llava.model.vision_tower
        self.out_dim = int(self.tower.config.hidden_size)
        self.image_size = int(self.tower.config.image_size)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        if frames.shape[-1] != self.image_size:
            frames = nn.functional.interpolate(frames, size=(self.image_size, self.image_size),
                                               mode="bilinear", align_corners=False)
        return self.tower(pixel_values=frames).pooler_output


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
