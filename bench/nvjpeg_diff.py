"""How far `embed.decode: gpu` (nvJPEG + tensor preprocessing on CUDA) moves pixels and scores from Pillow's.

    OUT=bench/results python bench/nvjpeg_diff.py     # on a GPU node; writes $OUT/diag.json

Per JPEG (tests/embed/test_decode.py's set, photos at 4:4:4, 4:2:2 and 4:2:0 chroma and three qualities, and
sensor noise at 4:4:4 and 4:2:0), it separates the two sources of difference: the decoder (nvJPEG's raw
pixels against Pillow's, and libjpeg-turbo's through torchvision against Pillow's) and the preprocessing (the
CUDA resize against the CPU resize of the same pixels), then gives the ViT-B-32 (random weights) image
embeddings' cosine and a caption score's difference against the Pillow path. Committed as
bench/results/nvjpeg-vs-pillow-<gpu>.json.
"""

import io
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before open_clip imports huggingface_hub
import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
from embed.test_decode import decode_test_images, noise_jpeg  # noqa: E402  (the tests' JPEG set)

from shardsmith.cli.demo import jpeg, photo  # noqa: E402
from shardsmith.embed.decode import decode_jpeg_batch, tensor_preprocess  # noqa: E402


def test_images(rng: np.random.Generator) -> list[tuple[str, bytes]]:
    named = [(f"test{i}", b) for i, b in enumerate(decode_test_images())]
    for sub in (0, 1, 2):  # Pillow's subsampling: 4:4:4, 4:2:2, 4:2:0
        for q in (75, 90, 95):
            named.append((f"photo s{sub} q{q}", jpeg(photo(rng, 480, 360), quality=q, subsampling=sub)))
    noise = Image.fromarray(rng.integers(0, 256, (133, 181, 3), dtype=np.uint8))
    named.append(("noise 4:4:4", jpeg(noise, quality=90, subsampling=0)))
    named.append(("noise 4:2:0", noise_jpeg(11, 181, 133)))
    return named


def main() -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-32").eval().to(device)
    pp = dict(model.visual.preprocess_cfg)
    transform = open_clip.transform.image_transform_v2(open_clip.transform.PreprocessCfg(**pp), is_train=False)
    tokens = open_clip.get_tokenizer("ViT-B-32")(["a photo of the old harbour at dusk"]).to(device)
    with torch.inference_mode():
        text = F.normalize(model.encode_text(tokens), dim=-1)
    std = torch.tensor(pp["std"]).view(1, 3, 1, 1) * 255  # normalised units back to 8-bit levels
    rows = []
    for name, data in test_images(np.random.default_rng(5)):
        pil_image = Image.open(io.BytesIO(data)).convert("RGB")
        raw_pil = torch.from_numpy(np.array(pil_image)).permute(2, 0, 1)
        payload = [torch.frombuffer(bytearray(data), dtype=torch.uint8)]
        decoded, failed = decode_jpeg_batch(payload, device)
        if failed:
            rows.append({"image": name, "refused": True})
            continue
        nv = decoded[0]
        turbo = decode_jpeg_batch(payload, torch.device("cpu"))[0][0]
        raw_diff = (nv.cpu().int() - raw_pil.int()).abs().float()
        pil_batch = transform(pil_image).unsqueeze(0)
        cuda_batch = tensor_preprocess([nv], pp).cpu()
        cpu_batch_of_nv = tensor_preprocess([nv.cpu()], pp)
        cpu_batch = tensor_preprocess([turbo], pp)
        with torch.inference_mode():
            emb = {
                k: model.encode_image(v.to(device)).float()
                for k, v in (("pil", pil_batch), ("cuda", cuda_batch), ("cpu", cpu_batch))
            }
        score = ((F.normalize(emb["cuda"], dim=-1) - F.normalize(emb["pil"], dim=-1)) * text).sum().abs()
        rows.append(
            {
                "image": name,
                "size": list(nv.shape),
                "raw_nv_vs_pil_mean": round(float(raw_diff.mean()), 3),
                "raw_nv_vs_pil_max": float(raw_diff.max()),
                "raw_turbo_vs_pil_mean": round(float((turbo.int() - raw_pil.int()).abs().float().mean()), 3),
                "prep_cuda_vs_cpu_same_pixels_max_level": round(
                    float(((cuda_batch - cpu_batch_of_nv) * std).abs().max()), 3
                ),
                "prep_cuda_vs_pil_mean_level": round(float(((cuda_batch - pil_batch) * std).abs().mean()), 3),
                "cos_cuda_pil": round(float(F.cosine_similarity(emb["cuda"], emb["pil"]).min()), 6),
                "cos_cpu_pil": round(float(F.cosine_similarity(emb["cpu"], emb["pil"]).min()), 7),
                "score_diff": round(float(score), 6),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "diag.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
