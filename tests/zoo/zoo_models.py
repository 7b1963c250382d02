"""The zoo: tiny real-world models built from configs with random weights (no downloads).

Each :class:`Case` builds its model (seeded by the caller), makes the batch of a step
from a generator of its own (so a recorded and an unrecorded run see the same data
whatever the global RNG does), computes the loss and builds its optimizer. Sizes: 2
layers, hidden size 32, sequence length 8, batch 2, images 3x32x32.

Hugging Face models come from ``transformers`` (GPT-2, Llama with activation checkpointing,
BERT, T5, ViT); the ResNet-18 and MobileNetV3-style nets are written here from
``torch.nn`` (in-place ReLU/Hardswish, BatchNorm, squeeze-excite, in-place residual adds):
the torchvision wheel for torch 2.13 on the index is a CUDA build whose compiled ops do not
load with the CPU torch (``operator torchvision::nms does not exist``), which also breaks
``import timm``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, SEQ, HIDDEN, LAYERS, VOCAB, IMAGE, CLASSES = 2, 8, 32, 2, 64, 32, 10


@dataclasses.dataclass
class Case:
    """One zoo model.

    Attributes:
        name: test id.
        build: ``build() -> nn.Module``, called right after ``torch.manual_seed(0)``.
        batch: ``batch(step) -> dict`` of tensors for that step.
        loss: ``loss(model, batch) -> 0-dim tensor``; ``model`` is what :attr:`wrap` returned.
        optim: ``optim(params) -> torch.optim.Optimizer``.
        first_input: key of ``batch`` holding the model's first input.
        wrap: ``wrap(model) -> the module handed to the debugger and called`` (torch.compile).
        context: ``context() -> context manager`` the forward runs in (autocast).
        warmup: run one untimed, unrecorded training step before the first recorded one
            (compilation happens there), then ``zero_grad``.
    """

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int], dict]
    loss: Callable[[Any, dict], torch.Tensor]
    optim: Callable[[Any], torch.optim.Optimizer]
    first_input: str
    wrap: Callable[[nn.Module], nn.Module] = lambda m: m
    context: Callable[[], Any] = contextlib.nullcontext
    warmup: bool = False


def _gen(step: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + step)


def _sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-3)


def _tokens(step: int) -> dict:
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=_gen(step))}


def _images(step: int) -> dict:
    g = _gen(step)
    return {"pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g),
            "labels": torch.randint(0, CLASSES, (BATCH,), generator=g)}


# --- Hugging Face transformers ---------------------------------------------------------------
def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=LAYERS, n_embd=HIDDEN, n_head=4, n_inner=64, vocab_size=VOCAB, n_positions=SEQ,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).train()


def _lm_loss(model, batch):
    return model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss


def _llama(reentrant: bool = False) -> nn.Module:
    """Llama with grouped-query attention (2 key/value heads for 4 query heads), RoPE and
    activation checkpointing of each decoder layer (``use_reentrant`` as given: False,
    HF's default, recomputes under saved-tensor hooks; True runs the first forward without
    grad and builds the graph in the recomputation)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2 * SEQ,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2, use_cache=False)
    model = LlamaForCausalLM(cfg).train()
    with warnings.catch_warnings():  # the deprecated name of activation_checkpointing_enable
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    return model


def _llama_reentrant() -> nn.Module:
    return _llama(reentrant=True)


def _bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=2 * SEQ, type_vocab_size=2, num_labels=3,
                     pad_token_id=0)
    return BertForSequenceClassification(cfg).train()


def _bert_batch(step: int) -> dict:
    g = _gen(step)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ - 3:] = 0  # the second sequence is padded
    types = torch.zeros(BATCH, SEQ, dtype=torch.long)
    types[:, SEQ // 2:] = 1
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types,
            "labels": torch.randint(0, 3, (BATCH,), generator=g)}


def _bert_loss(model, batch):
    return model(**batch).loss


def _t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=8, d_ff=64, num_layers=LAYERS, num_decoder_layers=LAYERS,
                   num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, use_cache=False)
    return T5ForConditionalGeneration(cfg).train()


def _t5_batch(step: int) -> dict:
    g = _gen(step)
    return {"input_ids": torch.randint(2, VOCAB, (BATCH, SEQ), generator=g),
            "labels": torch.randint(2, VOCAB, (BATCH, SEQ), generator=g)}


def _t5_loss(model, batch):
    return model(input_ids=batch["input_ids"], labels=batch["labels"]).loss


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification
    cfg = ViTConfig(image_size=IMAGE, patch_size=8, num_channels=3, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                    num_attention_heads=4, intermediate_size=64, num_labels=CLASSES)
    return ViTForImageClassification(cfg).train()


def _vit_loss(model, batch):
    return model(pixel_values=batch["pixel_values"], labels=batch["labels"]).loss


# --- nets written from torch.nn --------------------------------------------------------------
class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv+BN, one in-place ReLU module used twice, an
    in-place residual add (``out += identity``), a 1x1 conv+BN shortcut when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """ResNet-18 layout (stem, 4 stages of 2 basic blocks, average pool, fc) at widths 8-32."""

    def __init__(self, widths=(8, 16, 32, 32), classes: int = CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], widths[0]
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(BasicBlock(cin, w, stride), BasicBlock(w, w, 1)))
            cin = w
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class SqueezeExcite(nn.Module):
    """MobileNetV3 squeeze-excite: pool, 1x1 reduce, in-place ReLU, 1x1 expand, Hardsigmoid, scale."""

    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.relu = nn.ReLU(inplace=True)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.scale_activation = nn.Hardsigmoid(inplace=True)

    def forward(self, x):
        s = self.scale_activation(self.fc2(self.relu(self.fc1(self.avgpool(x)))))
        return s * x


class InvertedResidual(nn.Module):
    """MobileNetV3 block: 1x1 expand, depthwise kxk, optional squeeze-excite, 1x1 project
    (each conv with BatchNorm; in-place Hardswish or ReLU), in-place residual add."""

    def __init__(self, cin: int, expand: int, cout: int, kernel: int, stride: int, se: bool, hs: bool) -> None:
        super().__init__()
        act = nn.Hardswish if hs else nn.ReLU
        layers: list[nn.Module] = []
        if expand != cin:
            layers += [nn.Conv2d(cin, expand, 1, bias=False), nn.BatchNorm2d(expand), act(inplace=True)]
        layers += [nn.Conv2d(expand, expand, kernel, stride, kernel // 2, groups=expand, bias=False),
                   nn.BatchNorm2d(expand), act(inplace=True)]
        if se:
            layers.append(SqueezeExcite(expand, max(8, expand // 4)))
        layers += [nn.Conv2d(expand, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.use_res = stride == 1 and cin == cout

    def forward(self, x):
        out = self.block(x)
        if self.use_res:
            out += x
        return out


class MobileNetV3(nn.Module):
    """A small MobileNetV3: Hardswish stem, four inverted-residual blocks, 1x1 conv, pool,
    classifier Linear-Hardswish-Dropout-Linear."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish(inplace=True)),
            InvertedResidual(16, 16, 16, 3, 2, se=True, hs=False),
            InvertedResidual(16, 48, 24, 3, 2, se=False, hs=False),
            InvertedResidual(24, 64, 24, 3, 1, se=False, hs=False),
            InvertedResidual(24, 64, 32, 5, 2, se=True, hs=True),
            nn.Sequential(nn.Conv2d(32, 64, 1, bias=False), nn.BatchNorm2d(64), nn.Hardswish(inplace=True)),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(64, 64), nn.Hardswish(inplace=True), nn.Dropout(0.2),
                                        nn.Linear(64, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class RootParamViT(nn.Module):
    """A ViT whose class token and position embedding are parameters of the root module;
    its encoder layers call ``self_attn(x, x, x)`` (one tensor in three argument slots)."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        patches = (IMAGE // 8) ** 2
        self.patch_embed = nn.Conv2d(3, HIDDEN, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, HIDDEN) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, patches + 1, HIDDEN) * 0.02)
        layer = nn.TransformerEncoderLayer(HIDDEN, 4, 64, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.encoder(x))[:, 0])


def _image_loss(model, batch):
    return F.cross_entropy(model(batch["pixel_values"]), batch["labels"])


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(HIDDEN, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, CLASSES))


def _mlp_batch(step: int) -> dict:
    g = _gen(step)
    return {"x": torch.randn(BATCH, HIDDEN, generator=g), "labels": torch.randint(0, CLASSES, (BATCH,), generator=g)}


def _mlp_loss(model, batch):
    return F.cross_entropy(model(batch["x"]), batch["labels"])


def _compile(model: nn.Module) -> nn.Module:
    return torch.compile(model, backend="aot_eager")


def _bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


CASES = {c.name: c for c in (
    Case("gpt2", _gpt2, _tokens, _lm_loss, _adamw, "input_ids"),
    Case("llama_ckpt", _llama, _tokens, _lm_loss, _sgd, "input_ids"),
    Case("llama_reentrant", _llama_reentrant, _tokens, _lm_loss, _sgd, "input_ids"),
    Case("bert", _bert, _bert_batch, _bert_loss, _adamw, "input_ids"),
    Case("t5", _t5, _t5_batch, _t5_loss, _sgd, "input_ids"),
    Case("vit", _vit, _images, _vit_loss, _adamw, "pixel_values"),
    Case("resnet18", ResNet18, _images, _image_loss, _sgd, "pixel_values"),
    Case("mobilenetv3", MobileNetV3, _images, _image_loss, _adamw, "pixel_values"),
    Case("gpt2_bf16", _gpt2, _tokens, _lm_loss, _adamw, "input_ids", context=_bf16),
    Case("root_params", RootParamViT, _images, _image_loss, _adamw, "pixel_values"),
    Case("mlp_compiled", _mlp, _mlp_batch, _mlp_loss, _sgd, "x", wrap=_compile, warmup=True),
)}
