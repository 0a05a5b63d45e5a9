import pytest
import torch
import torch.nn.functional as F

from data.robot.task import to_float
from tokenizer_vq import VQConfig, VQVAE, VectorQuantizer, codebook_stats, load_vq, save_vq


def test_shapes_and_roundtrip_api():
    torch.manual_seed(0)
    vq = VQVAE(VQConfig(channels=(8, 8, 16), n_codes=64))
    x = torch.rand(2, 3, 64, 64)
    rec, loss, idx = vq(x)
    assert rec.shape == x.shape and idx.shape == (2, 8, 8) and loss.ndim == 0
    vq.eval()
    codes = vq.tokenize((x * 255).byte().permute(0, 2, 3, 1).numpy())
    assert codes.shape == (2, 64) and codes.dtype == torch.long
    assert 0 <= int(codes.min()) and int(codes.max()) < vq.config.n_codes
    frames = vq.detokenize(codes)
    assert frames.shape == (2, 3, 64, 64) and 0 <= float(frames.min()) and float(frames.max()) <= 1
    # tokenize(detokenize(c)) is not c in general, but decoding the codes of x gives the model's own reconstruction
    assert torch.allclose(vq.detokenize(vq.tokenize(x)), (vq(x)[0]).clamp(0, 1), atol=1e-5)


def test_copy_gate_copies_the_context_where_a_cell_keeps_its_code():
    torch.manual_seed(0)
    vq = VQVAE(VQConfig(channels=(8, 8, 16), n_codes=64)).eval()
    vq(torch.rand(4, 3, 64, 64))                      # the codebook initialised from data
    ctx = torch.rand(2, 3, 64, 64)
    codes = vq.tokenize(ctx)
    codes[:, 9] = (codes[:, 9] + 1) % 64              # one changed cell: row 1, column 1
    plain = vq.detokenize(codes, ctx)                 # no gate: the context is ignored
    assert torch.equal(plain, vq.detokenize(codes))
    vq.copy_gate = True
    gated = vq.detokenize(codes, ctx)
    cell = (slice(None), slice(None), slice(8, 16), slice(8, 16))
    assert torch.equal(gated[cell], plain[cell])      # the changed cell: decoded
    rest = torch.ones(64, 64, dtype=torch.bool)
    rest[8:16, 8:16] = False
    assert torch.equal(gated[:, :, rest], ctx[:, :, rest])   # every other cell: the context
    assert not torch.equal(plain[:, :, rest], ctx[:, :, rest])
    # a uint8 context (policy_eval's frames) is read as tokenize reads it
    ctx8 = (ctx * 255).round().byte().permute(0, 2, 3, 1).numpy()
    assert torch.equal(vq.detokenize(codes, ctx8), vq.detokenize(codes, to_float(ctx8)))


def test_vq_picks_nearest_code_and_passes_gradients_straight_through():
    q = VectorQuantizer(4, 2, beta=0.25)
    q.codebook.data = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    q.initialised.fill_(True)
    z = torch.tensor([[[[0.9]], [[0.1]]], [[[0.2]], [[0.7]]]], requires_grad=True)  # (2, 2, 1, 1)
    zq, loss, idx = q(z)
    assert idx.flatten().tolist() == [1, 2]
    assert torch.allclose(zq.detach().flatten(1), torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    zq.sum().backward()
    assert torch.allclose(z.grad, torch.ones_like(z))           # straight-through: d zq / d z = 1
    expected = 1.25 * F.mse_loss(torch.tensor([[0.9, 0.1], [0.2, 0.7]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    assert torch.allclose(loss, expected)


def test_codebook_init_from_data_and_dead_code_restart():
    torch.manual_seed(0)
    q = VectorQuantizer(16, 3, beta=0.25).train()
    z = torch.randn(4, 3, 4, 4) + 10.0                            # data far from the random init
    q(z)
    flat = z.permute(0, 2, 3, 1).reshape(-1, 3)
    assert q.codebook.detach().mean() > 9                         # initialised from encoder outputs
    q.usage.fill_(1.0)
    q.usage[[3, 7]] = 0.0
    before = q.codebook.detach().clone()
    assert q.restart_dead(flat) == 2
    changed = (q.codebook.detach() != before).any(1)
    assert changed.nonzero().flatten().tolist() == [3, 7]
    assert q.usage[3] == 1.0


def test_codebook_stats():
    s = codebook_stats(torch.tensor([0, 1, 2, 3] * 5), 8)
    assert s["used"] == 4 and abs(s["perplexity"] - 4.0) < 1e-5
    assert codebook_stats(torch.zeros(10, dtype=torch.long), 8)["perplexity"] == pytest.approx(1.0)


def test_training_reduces_loss_and_save_load(tmp_path):
    torch.manual_seed(0)
    vq = VQVAE(VQConfig(channels=(8, 16, 16), n_codes=32))
    x = torch.rand(8, 3, 1, 1).expand(8, 3, 32, 32).contiguous()  # flat colours: easy to learn
    opt = torch.optim.Adam(vq.parameters(), lr=1e-3)
    errors = []
    for _ in range(150):
        rec, qloss, _ = vq(x)
        err = F.mse_loss(rec, x)
        opt.zero_grad()
        (err + qloss).backward()
        opt.step()
        errors.append(err.item())
    assert sum(errors[-5:]) / 5 < 0.3 * errors[0]
    save_vq(tmp_path / "vq.safetensors", vq, {"psnr_heldout": 1.0})
    back, header = load_vq(tmp_path / "vq.safetensors")
    vq.eval()
    assert header["psnr_heldout"] == 1.0 and back.config == vq.config
    assert torch.equal(back.tokenize(x), vq.tokenize(x))
    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    with pytest.raises(ValueError, match="junk.safetensors"):
        load_vq(tmp_path / "junk.safetensors")
