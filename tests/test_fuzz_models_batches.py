"""The models generator's batches as trainers feed them (suites/generators/model_batches.py):
sequence lengths, right padding with -100 labels, and the loss each side computes (quick, one
process). The planted bug the features find runs with the other plants (tests/test_fuzz_models.py,
pad_tokens_counted)."""

from __future__ import annotations

import torch

from distci.fuzz.models import Drawer, parse_space
from suites.generators import model_batches as mb
from suites.generators import model_structures as ms
from suites.generators.model_space import complete, key, parse, problems, valid


def test_each_batch_has_the_length_its_seq_value_says():
    for seq, lengths in (("fixed", [4, 4]), ("odd", [5, 5]), ("one", [1, 1]), ("varied", [3, 6, 2, 7])):
        s = complete({"parallel": "ddp", "steps": 2, "accum": 2 if seq == "varied" else 1, "seq": seq})
        got = [tokens.shape[1] for micro in ms.data(s, ms.VOCAB, 2) for tokens, _ in micro]
        assert got == lengths, (seq, got)


def test_an_unpadded_fixed_structure_gets_the_batches_it_got_before_these_features():
    gen = torch.Generator().manual_seed(ms.SEED + 1)
    before = [(torch.randint(0, 32, (2, 4), generator=gen), torch.randint(0, 32, (2, 4), generator=gen))
              for _ in range(2)]
    now = [b for micro in ms.data(complete({"parallel": "ddp", "steps": 2}), 32, 2) for b in micro]
    assert all(torch.equal(a, b) for x, y in zip(before, now) for a, b in zip(x, y))


def test_padding_is_right_padding_with_ignored_labels_and_one_full_row():
    s = complete({"parallel": "ddp", "steps": 3, "seq": "varied", "pad": True})
    for micro in ms.data(s, ms.VOCAB, 4):
        for tokens, labels in micro:
            valid_per_row = (labels != mb.IGNORE_INDEX).sum(1)
            assert valid_per_row.min() >= 1 and valid_per_row.max() == labels.shape[1]
            for row, n in enumerate(valid_per_row.tolist()):
                assert (labels[row, n:] == mb.IGNORE_INDEX).all() and (tokens[row, n:] == mb.PAD_ID).all()
                assert (labels[row, :n] != mb.IGNORE_INDEX).all()
    assert len({int((l != -100).sum()) for m in ms.data(s, ms.VOCAB, 4) for _, l in m}) > 1


def test_t5_pads_its_decoder_side_only():
    s = complete({"parallel": "fsdp", "family": "encdec", "steps": 2, "pad": True, "seq": "odd"})
    (tokens, labels), = ms.data(s, ms.VOCAB, 2)[0]
    (whole, _), = ms.data({**s, "pad": False}, ms.VOCAB, 2)[0]
    assert tokens.shape == (2, 2, 5) and (tokens[:, 1][labels == -100] == mb.PAD_ID).all()
    assert torch.equal(tokens[:, 0], whole[:, 0]) and (labels == -100).any()


def test_the_shards_losses_make_the_reference_loss_and_its_gradient():
    """mean: the shards' losses average to the reference's; tokens: they add up to it (FSDP2
    sums the gradients); items: scaled by the shard count they average to it."""
    gen = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 7, (4, 5), generator=gen)
    labels[0, 2:], labels[3, 1:] = -100, -100
    for loss, combine in (("mean", "avg"), ("tokens", "sum"), ("items", "avg")):
        s = complete({"parallel": "ddp" if loss != "tokens" else "fsdp", "pad": True, "loss": loss})
        logits = torch.randn(4, 5, 7, generator=torch.Generator().manual_seed(4), requires_grad=True)
        count = mb.valid_tokens(labels)
        ref = mb.reference_loss(s, logits, labels, count, 2, 1)
        (ref_grad,) = torch.autograd.grad(ref, logits)
        parts = [mb.parallel_loss(s, x, y, count, 2, 1) for x, y in zip(logits.chunk(2), labels.chunk(2))]
        total = sum(parts) / (2 if combine == "avg" else 1)
        (grad,) = torch.autograd.grad(total, logits)
        torch.testing.assert_close(total, ref)
        torch.testing.assert_close(grad, ref_grad)
        torch.testing.assert_close(mb.recorded(s, sum(p.detach() for p in parts) / 2, 2), ref.detach())


def test_batch_rules_say_only_what_is_meaningless():
    assert problems({"parallel": "ddp", "seq": "varied"}) == [
        "seq=varied gives each batch its own length: it needs a second batch (steps or accum > 1)"]
    assert valid({"parallel": "ddp", "seq": "varied", "accum": 2})
    assert problems({"parallel": "ddp", "seq": "one", "pad": True})
    assert problems({"parallel": "fsdp", "family": "vit", "seq": "odd"})
    assert valid({"parallel": "fsdp", "family": "encdec", "seq": "odd", "pad": True, "loss": "tokens"})
    assert problems({"parallel": "pp", "loss": "items"}) and valid({"parallel": "pp", "seq": "odd", "pad": True})
    assert problems({"parallel": "ddp", "loss": "tokens"}) and valid({"parallel": "ddp", "loss": "items"})
    assert valid({"parallel": "tp", "plan": "titan", "seq": "one", "loss": "tokens"})


def test_the_batch_features_are_drawn_where_they_mean_something():
    drawer = Drawer("batches", parse_space(["seq=odd,one,varied"]))
    drawn = [drawer.draw() for _ in range(40)]
    assert {s["seq"] for s in drawn} == {"odd", "one", "varied"}
    assert {s["loss"] for s in drawn} >= {"mean", "tokens", "items"} and any(s["pad"] for s in drawn)
    for s in drawn:
        assert valid(s) and s["family"] not in ("vit", "vit_mha") and parse(key(s)) == s
