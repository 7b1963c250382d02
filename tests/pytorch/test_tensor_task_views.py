"""Task ``tensor`` end to end with non-contiguous inputs (transposed, expanded, channels_last,
strided, negative-bit and conjugate views, bool permutes, complex32): every exported
``.pt`` equals the live tensor's values bit for bit; with the staging directory removed
externally between steps the files are still written (from the shards) and equal."""
from __future__ import annotations

import ctypes
import shutil

import torch

from msprobe.pytorch import PrecisionDebugger
from store.payload_writer import stage_dir


def raw(t: torch.Tensor) -> bytes:
    """C-order bytes of ``t``'s values (negative and conjugate bits resolved)."""
    x = t.detach().resolve_conj().resolve_neg().contiguous()
    return ctypes.string_at(x.data_ptr(), x.numel() * x.element_size())


def views(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return {
        "transposed": r(8, 16, 4).transpose(0, 1),
        "expanded": r(3, 1).expand(3, 5),
        "scalar_expanded": torch.tensor(2.5 + seed).expand(2, 3),
        "channels_last": r(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
        "strided_bf16": r(6, 10).to(torch.bfloat16)[:, ::3],
        "neg_view": r(4, 6).t()._neg_view(),
        "conj_t": torch.complex(r(3, 4), r(3, 4)).conj().t(),
        "bool_perm": (r(2, 3, 4) > 0).permute(2, 0, 1),
        "chalf_t": torch.complex(r(3, 4), r(3, 4)).to(torch.complex32).t(),
        "f8_t": r(4, 8).to(torch.float8_e4m3fn).t(),
    }


def record_step(tensors):
    for t in tensors.values():
        t.flatten()


def check(tdir, tensors):
    for i, (name, t) in enumerate(tensors.items()):
        saved = torch.load(tdir / f"Tensor.flatten.{i}.forward.input.0.pt", weights_only=True, mmap=True)
        assert saved.dtype == t.dtype and saved.shape == t.shape, name
        assert raw(saved) == raw(t), name


def test_non_contiguous_views_exported_bit_exact_with_stage_dir_removed(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="tensor")
    steps = [views(s) for s in range(3)]
    for s, tensors in enumerate(steps):
        dbg.start()
        record_step(tensors)
        if s == 1:  # staged files of this step (and the directory) removed before the export
            dbg.session._payloads.flush()  # noqa: SLF001 - make the staging happen first
            shutil.rmtree(stage_dir(tmp_path))
        if s == 2:  # the writer made the directory again for the later payloads of this step
            dbg.session._payloads.flush()  # noqa: SLF001
            assert len(list(stage_dir(tmp_path).rglob("*.pt"))) == 2 * len(tensors) - 1
        dbg.stop()
        dbg.step()
    dbg.close()
    for s, tensors in enumerate(steps):
        check(tmp_path / f"step{s}" / "rank" / "dump_tensor_data", tensors)
    assert not stage_dir(tmp_path).exists() or not any(stage_dir(tmp_path).rglob("*.pt"))
