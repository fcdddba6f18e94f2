"""The vectorised MaskTokensDataset gives fairseq's items exactly, for every masking option."""

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary, ListDataset
from fairseq.data import MaskTokensDataset as FairseqMaskTokensDataset

from seed_fairseq.pretrain.data.mask_tokens_dataset import MaskTokensDataset, _ranges

VOCAB = 37  # odd: the specials, 31 pieces, <mask>


@pytest.fixture(scope="module")
def setup():
    d = Dictionary()
    for i in range(VOCAB - d.nspecial - 1):
        d.add_symbol(f"p{i}", n=i + 1)  # counts for --freq-weighted-replacement
    mask_idx = d.add_symbol("<mask>")
    rng = np.random.default_rng(3)
    blocks = []
    for n in (1, 2, 7, 23, 61, 130):
        body = rng.integers(d.nspecial, mask_idx, size=n - 1)
        blocks.append(torch.from_numpy(np.concatenate([[d.bos()], body]).astype(np.int64)))
    blocks[-1][40] = d.eos()  # a separator inside a block
    starts = torch.zeros(len(d), dtype=torch.uint8)
    starts[: d.nspecial] = 1
    starts[mask_idx] = 1
    starts[d.nspecial : mask_idx : 3] = 1  # every third piece starts a word
    return d, mask_idx, ListDataset(blocks, sizes=np.array([len(b) for b in blocks])), starts


OPTIONS = [
    {},
    {"whole": True},
    {"whole": True, "mask_prob": 0.3},
    {"leave_unmasked_prob": 0.0, "random_token_prob": 0.0},
    {"leave_unmasked_prob": 0.0, "random_token_prob": 0.2, "whole": True},
    {"leave_unmasked_prob": 0.2, "random_token_prob": 0.0},
    {"freq_weighted_replacement": True, "random_token_prob": 0.3, "leave_unmasked_prob": 0.1},
    {"mask_multiple_length": 3},
    {"mask_multiple_length": 2, "mask_stdev": 1.5},
    {"mask_multiple_length": 3, "mask_stdev": 2.0, "whole": True},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_items_equal_fairseqs(setup, options):
    d, mask_idx, blocks, starts = setup
    options = dict(options)
    kwargs = dict(
        pad_idx=d.pad(), mask_idx=mask_idx, seed=5, mask_whole_words=starts if options.pop("whole", 0) else None
    )
    kwargs.update(options)
    ours = MaskTokensDataset.apply_mask(blocks, d, **kwargs)
    theirs = FairseqMaskTokensDataset.apply_mask(blocks, d, **kwargs)
    changed = 0
    for epoch in (1, 2):
        for a, b in zip(ours, theirs):
            a.set_epoch(epoch)
            b.set_epoch(epoch)
        for i in range(len(blocks)):
            for a, b in zip(ours, theirs):
                x, y = a[i], b[i]
                assert x.dtype == y.dtype and torch.equal(x, y), (options, epoch, i)
            changed += int(ours[1][i].ne(d.pad()).sum())
    assert changed > 0  # something was masked


def test_ranges():
    assert _ranges(np.array([2, 0, 3, 1])).tolist() == [0, 1, 0, 1, 2, 0]
    assert _ranges(np.array([], dtype=np.int64)).tolist() == []


def test_refuses_mask_in_data(setup):
    d, mask_idx, _, _ = setup
    ds = MaskTokensDataset(ListDataset([torch.tensor([d.bos(), mask_idx])], sizes=np.array([2])), d, d.pad(), mask_idx)
    with pytest.raises(AssertionError, match="mask_idx"):
        ds[0]
