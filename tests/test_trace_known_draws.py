"""Known values: a random factory's CPU draw is made when its value is first read, with the value an immediate draw
gives (uvmlab.trace.known_values); a view op runs nothing on the CPU."""

from __future__ import annotations

import torch

from uvmlab.trace.known_values import SEED, KnownLiterals, KnownValues


def test_draws_are_made_when_read_in_their_order_with_the_values_of_immediate_draws() -> None:
    gen = torch.Generator().manual_seed(SEED)
    refs = [torch.randn(4, 8, generator=gen), torch.randint(0, 100, (16,), generator=gen), torch.rand(3, generator=gen)]
    ref_d = torch.randn(2, generator=gen)
    ref_e = torch.empty(5).normal_(generator=gen)
    values = KnownValues()
    with KnownLiterals(values), values:
        a = torch.randn(4, 8, device="meta")
        b = torch.randint(0, 100, (16,), device="meta")
        c = torch.rand(3, device="meta")
        assert len(values._draws) == 3  # nothing drawn yet
        square = b.view(4, 4)  # a view of a pending draw: still not drawn
        assert len(values._draws) == 3
        del a  # dies unread: drawn anyway, in its turn, so that the later draws keep their values
        assert c.sum().item() == refs[2].sum().item()  # reading c makes a, b and c
        assert len(values._draws) == 0
        d = torch.randn(2, device="meta")
        e = torch.empty(5, device="meta").normal_()  # a seeded CPU op makes the pending draws first
    assert torch.equal(values.value(b), refs[1])
    assert torch.equal(values.value(square), refs[1].view(4, 4))
    assert torch.equal(values.value(d), ref_d)
    assert torch.equal(values.value(e), ref_e)
    assert values.counts["ops mirrored"] >= 5  # each draw and the view, as when they were made at once


def test_a_pending_draw_written_through_or_resized_before_it_is_read() -> None:
    gen = torch.Generator().manual_seed(SEED)
    torch.randn(6, generator=gen)
    ref_y = torch.randn(3, generator=gen)
    values = KnownValues()
    with KnownLiterals(values), values:
        x = torch.randn(6, device="meta")
        y = torch.randn(3, device="meta")
        x.fill_(2.0)  # an op on x makes x's draw (y's stays pending) and runs on its value
        assert x.sum().item() == 12.0
        z = torch.randn(4, device="meta")
        z.untyped_storage().resize_(32)  # resized in place: its value says nothing any more
    assert torch.equal(values.value(y), ref_y)
    assert values.value(z) is None
