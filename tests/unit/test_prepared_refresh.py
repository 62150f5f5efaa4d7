"""The per-forward check of prepared weights (translator.state.refresh_prepared): one comparison when
no parameter changed; a rebuild after tm.load_state_dict, an optimizer step and an in-place update;
a write through `.data`, which no version counter sees, after refresh_prepared(force=True)."""

import torch
import torch.nn as nn

from translator import translate
from translator.state import _PREPARED, refresh_prepared
from translator.tolerances import model_tol

from test_lazy_prepared import MLP  # two linears with a relu between: 32 -> 64 -> 16


def _translated(seed=0):
    torch.manual_seed(seed)
    m = MLP().eval()
    x = torch.randn(4, 32)
    tm = translate(m, (x,), backend="reference", verify=False)
    assert len(_PREPARED[tm.gm].entries) == 2  # the two preshuffled GEMM weights
    return m, x, tm


def test_no_change_rebuilds_nothing_and_each_update_is_seen():
    m, x, tm = _translated()
    tol = model_tol(check="few_ops")
    with torch.no_grad():
        tm(x)
        assert refresh_prepared(tm.gm) == 0
        before = tm(x)
        m.load_state_dict({k: v * 0.5 + 0.1 for k, v in m.state_dict().items()})  # the model's
        after = tm(x)
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, m(x), **tol)
        other_m, _, other = _translated(seed=1)
        tm.load_state_dict(other.state_dict())  # the translated module's own: its prepared buffers too
        torch.testing.assert_close(tm(x), other_m(x), **tol)
        m.load_state_dict(m.state_dict())  # the model's parameters written again: its weights win again
        torch.testing.assert_close(tm(x), m(x), **tol)
        m.b.weight.mul_(-1)  # in place under no_grad
        torch.testing.assert_close(tm(x), m(x), **tol)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    m.train()
    torch.nn.functional.mse_loss(m(x), torch.zeros(4, 16)).backward()
    opt.step()  # an optimizer's in-place update
    m.eval()
    with torch.no_grad():
        torch.testing.assert_close(tm(x), m(x), **tol)
        assert refresh_prepared(tm.gm) == 0  # the forward above rebuilt what changed; nothing since


def test_a_write_through_data_needs_a_forced_refresh():
    m, x, tm = _translated()
    tol = model_tol(check="few_ops")
    with torch.no_grad():
        stale = tm(x)
        m.a.weight.data.copy_(torch.randn(64, 32))  # `.data` has its own version counter: not seen
        torch.testing.assert_close(tm(x), stale, rtol=0, atol=0)
        assert refresh_prepared(tm.gm, force=True) == 2
        torch.testing.assert_close(tm(x), m(x), **tol)


def test_a_source_written_between_two_registrations_is_still_rebuilt():
    """The all-sources stamp is taken by the next refresh, not at registration: a source written
    after its copy was made and before the next copy's registration is still seen."""
    from translator.state import prepared

    gm = torch.fx.GraphModule(nn.Module(), torch.fx.Graph())
    p, q = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))
    gm.register_buffer("p2", p.detach() * 2)
    gm.register_buffer("q2", q.detach() * 2)
    prepared(gm, "p2", lambda t: t * 2, [p])
    with torch.no_grad():
        p.mul_(3)
    prepared(gm, "q2", lambda t: t * 2, [q])
    assert refresh_prepared(gm) == 1 and torch.equal(gm.p2, torch.full((3,), 6.0))
    assert refresh_prepared(gm) == 0
