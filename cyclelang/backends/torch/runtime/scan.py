"""The chunked scans of the recurrent mixers (ssm, linear_attention) and Mamba-2's gated norm.

Both scans compute a linear recurrence s_t = g_t s_{t-1} + k_t^T v_t, y_t = q_t s_t in two
forms that give the same numbers: chunk by chunk for a sequence (inside a chunk, a masked
product like attention's; between chunks only the state is carried, so the cost per token
stops growing with the length), and one step at a time for decoding. The state they return
is all a decoder keeps: its size does not depend on how many tokens came before.
"""

import torch
from torch.nn import functional as F


def ssd_scan(x, dt, A, B, C, chunk, state=None):
    """Mamba-2's selective scan (the SSD algorithm, Dao & Gu 2024), in float32 or wider.

    x: (b, T, h, p) inputs; dt: (b, T, h) step sizes; A: (h,) negative rates; B, C: (b, T, h, n).
    state: (b, h, p, n) from earlier positions, or None. The recurrence, per head:
        s_t = exp(dt_t A) s_{t-1} + dt_t x_t B_t^T        (b, h, p, n)
        y_t = s_t C_t                                     (b, h, p)
    Returns y (b, T, h, p) in x's dtype and the state after the last position (float32 or
    wider)."""
    b, T, h, p = x.shape
    dtype = x.dtype
    # float32 at least, as transformers' scan; float64 stays
    work = torch.promote_types(dtype, torch.float32)
    x, dt, B, C = x.to(work), dt.to(work), B.to(work), C.to(work)
    if state is None:
        state = x.new_zeros(b, h, p, B.size(-1))
    a = dt * A.to(work)  # (b, T, h): log of each step's decay
    u = x * dt[..., None]  # (b, T, h, p): dt x, what enters the state
    if T == 1:  # decoding: the recurrence itself, one step
        state = state * a[:, 0, :, None, None].exp() + u[:, 0, :, :, None] * B[:, 0, :, None, :]
        return torch.einsum("bhpn,bhn->bhp", state, C[:, 0])[:, None].to(dtype), state
    ys = []
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        ac, uc, Bc, Cc = a[:, start:end], u[:, start:end], B[:, start:end], C[:, start:end]
        l = end - start
        cum = ac.cumsum(dim=1)  # (b, l, h): decay from the chunk's start
        # exp(a_{s+1} + ... + a_t) at (t, s), 0 for s > t: sums of masked copies, not a difference
        # of cumulative
        # sums, which would lose precision over a long chunk
        below = torch.ones(l, l, dtype=torch.bool, device=x.device).tril(-1)
        # (b, h, l, l)
        sums = ac.transpose(1,
                            2)[..., None].expand(b, h, l, l).masked_fill(~below, 0).cumsum(dim=-2)
        decay = sums.masked_fill(
            ~below.logical_or(torch.eye(l, dtype=torch.bool, device=x.device)),
            -float("inf")).exp()
        # (b, h, l, l): masked, like causal attention
        scores = torch.einsum("bthn,bshn->bhts", Cc, Bc) * decay
        y = torch.einsum("bhts,bshp->bthp", scores, uc)  # what the chunk contributes to itself
        # what the state brings in
        y = y + torch.einsum("bthn,bhpn->bthp", Cc, state) * cum.exp()[..., None]
        # (b, l, h): decay from each position to the chunk's end
        to_end = (cum[:, -1:] - cum).exp()
        state = state * cum[
            :, -1, :, None,
            None].exp() + torch.einsum("bshn,bshp->bhpn", Bc * to_end[..., None], uc)
        ys.append(y)
    return torch.cat(ys, dim=1).to(dtype), state


def gated_rms_norm(y, z, weight, groups, eps):
    """Mamba-2's gated RMSNorm: y * silu(z), normalised over each of `groups` equal groups of
    channels (in float32 or wider), times the gain."""
    dtype = y.dtype
    work = torch.promote_types(dtype, torch.float32)
    h = y.to(work) * F.silu(z.to(work))
    h = h.view(*h.shape[:-1], groups, -1)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.flatten(-2).to(dtype)


def linear_scan(q, k, v, chunk, state=None, log_decay=None):
    """Causal linear attention (Katharopoulos et al. 2020), chunk by chunk, in q's dtype.

    q, k: (B, nh, T, d) feature-mapped; v: (B, nh, T, e); state: (B, nh, d, e) or None.
    log_decay: (nh,) log g per head (RetNet's retention), or None for g = 1. The recurrence:
        S_t = g S_{t-1} + k_t^T v_t,   y_t = q_t S_t
    Returns y (B, nh, T, e) and the state after the last position."""
    Bsz, nh, T, d = q.shape
    if state is None:
        state = q.new_zeros(Bsz, nh, d, v.size(-1))
    if T == 1:  # decoding: one step of the recurrence
        if log_decay is not None:
            state = state * log_decay.exp()[:, None, None]
        state = state + k.transpose(-2, -1) @ v  # (B, nh, d, e)
        return q @ state, state
    ys = []
    for start in range(0, T, chunk):
        qc, kc, vc = q[
            :, :,
            start : start + chunk], k[:, :, start : start + chunk], v[:, :, start : start + chunk]
        l = qc.size(2)
        t = torch.arange(l, device=q.device)
        gap = (t[:, None] - t[None, :]).to(q.dtype)  # (l, l): how far back each key is
        scores = qc @ kc.transpose(-2, -1)  # (B, nh, l, l)
        if log_decay is None:
            scores = scores.masked_fill(gap < 0, 0)  # causal: no key after its query
            y = scores @ vc + qc @ state
            state = state + kc.transpose(-2, -1) @ vc
        else:
            g = log_decay.to(q.dtype)[:, None, None]  # (nh, 1, 1)
            # (nh, l, l): g^(t - s) for s <= t
            weights = torch.exp(gap.clamp(min=0) * g).masked_fill(gap < 0, 0)
            y = (scores * weights) @ vc + (qc * torch.exp((t + 1).to(q.dtype) * g[..., 0])[
                ..., None]) @ state
            state = state * torch.exp(l * g) + (kc * torch.exp((
                l - 1 - t).to(q.dtype) * g[..., 0])[..., None]).transpose(-2, -1) @ vc
        ys.append(y)
    return torch.cat(ys, dim=2), state


def selective_scan(x, dt, A, B, C, chunk, state=None):
    """Mamba-1's selective scan (Gu & Dao 2023), one state per channel, in float32 or wider.

    x, dt: (b, T, d) inputs and step sizes; A: (d, n) negative rates; B, C: (b, T, n).
    state: (b, d, n) from earlier positions, or None. The recurrence, per channel:
        h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t          (b, d, n)
        y_t = h_t C_t                                     (b, d)
    Every channel decays each state dim at its own rate, so Mamba-2's trick (one decay per
    head, a masked product like attention's) does not apply. Within a chunk the recurrence
    is a Hillis-Steele scan, log2(chunk) elementwise steps that multiply decays (never divide
    by them, so nothing overflows); between chunks the state is carried. Returns y (b, T, d)
    in x's dtype and the state after the last position (float32 or wider)."""
    b, T, d = x.shape
    dtype = x.dtype
    # float32 at least, as transformers' scan; float64 stays
    work = torch.promote_types(dtype, torch.float32)
    x, dt, B, C, A = x.to(work), dt.to(work), B.to(work), C.to(work), A.to(work)
    if state is None:
        state = x.new_zeros(b, d, A.size(-1))
    if T == 1:  # decoding: the recurrence itself, one step
        state = torch.exp(dt[:, 0, :, None] * A) * state + (dt[:, 0] * x[:, 0])[
            ..., None] * B[:, 0, None, :]
        return torch.einsum("bdn,bn->bd", state, C[:, 0])[:, None].to(dtype), state
    ys = []
    for start in range(0, T, chunk):
        dtc = dt[:, start : start + chunk]
        l = dtc.size(1)
        a = torch.exp(dtc[..., None] * A)  # (b, l, d, n): each step's decay
        # (b, l, d, n): what enters
        u = (dtc * x[:, start : start + chunk])[..., None] * B[:, start : start + chunk, None, :]
        # the carried state enters at the first position
        u = torch.cat((u[:, :1] + a[:, :1] * state[:, None], u[:, 1:]), dim=1)
        k = 1
        while k < l:  # after this step, u_t holds the last 2k inputs, each decayed to t
            u = torch.cat((u[:, :k], u[:, k:] + a[:, k:] * u[:, :-k]), dim=1)
            if 2 * k < l:
                # the decay over the last 2k steps
                a = torch.cat((a[:, :k], a[:, k:] * a[:, :-k]), dim=1)
            k *= 2
        # (b, l, d): the state read by C
        ys.append(torch.einsum("btdn,btn->btd", u, C[:, start : start + chunk]))
        state = u[:, -1]
    return torch.cat(ys, dim=1).to(dtype), state


def gated_delta_scan(q, k, v, g, beta, chunk, state=None):
    """The gated delta rule (Yang, Kautz & Hatamizadeh 2024), chunk by chunk, in float32 or wider.

    q, k: (b, h, T, dk) as projected (L2-normalised here; q then scaled by dk^-1/2); v: (b, h, T, dv);
    g: (b, h, T) log decays (<= 0); beta: (b, h, T) write strengths in (0, 1); state: (b, h, dk, dv)
    from earlier positions, or None. The recurrence, per head (S maps a key to a value):
        S_t = exp(g_t) S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t)
        o_t = S_t^T q_t
    which is S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T. Inside a chunk the
    writes u depend on each other through a unit lower-triangular system, (I + A) U = beta V -
    beta Gamma K S_0 with A_ts = beta_t exp(g_{s+1} + ... + g_t) k_t.k_s for s < t, solved once
    per chunk; between chunks only S is carried, so the cost per token stops growing with T.
    Returns o (b, h, T, dv) in v's dtype and the state after the last position."""
    b, h, T, dk = k.shape
    dtype = v.dtype
    work = torch.promote_types(dtype, torch.float32)  # float32 at least; float64 stays
    q, k, v, g, beta = q.to(work), k.to(work), v.to(work), g.to(work), beta.to(work)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * dk**-0.5  # L2-normalised, then the usual scale
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    if state is None:
        state = v.new_zeros(b, h, dk, v.size(-1))
    state = state.to(work)
    if T == 1:  # decoding: the recurrence itself, one step
        state = state * g[:, :, 0, None, None].exp()
        u = beta[:, :, 0, None] * (v[:, :, 0] - torch.einsum("bhkv,bhk->bhv", state, k[:, :, 0]))  # (b, h, dv)
        state = state + k[:, :, 0, :, None] * u[:, :, None, :]
        return torch.einsum("bhkv,bhk->bhv", state, q[:, :, 0])[:, :, None].to(dtype), state
    ys = []
    for start in range(0, T, chunk):
        qc, kc, vc = q[:, :, start : start + chunk], k[:, :, start : start + chunk], v[:, :, start : start + chunk]
        gc, bc = g[:, :, start : start + chunk], beta[:, :, start : start + chunk]
        l = gc.size(-1)
        cum = gc.cumsum(dim=-1)  # (b, h, l): log decay from the chunk's start
        # log decay from s to t, g_{s+1} + ... + g_t at (t, s) for s <= t: sums of masked copies, not a difference
        # of cumulative sums, which would lose precision over a long chunk
        below = torch.ones(l, l, dtype=torch.bool, device=q.device).tril(-1)
        sums = gc[..., None].expand(b, h, l, l).masked_fill(~below, 0).cumsum(dim=-2)  # (b, h, l, l)
        decay = sums.masked_fill(~below.logical_or(torch.eye(l, dtype=torch.bool, device=q.device)), -float("inf")).exp()
        kk = (kc @ kc.transpose(-2, -1)) * decay * bc[..., None]  # (b, h, l, l): beta_t decay(t, s) k_t.k_s
        system = kk.masked_fill(~below, 0) + torch.eye(l, dtype=work, device=q.device)  # I + A, unit lower-triangular
        start_decay = cum.exp()[..., None]  # (b, h, l, 1): decay from the chunk's start to t
        rhs = torch.cat((vc * bc[..., None], kc * (bc[..., None] * start_decay)), dim=-1)  # [beta V | beta Gamma K]
        sol = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        u = sol[..., : vc.size(-1)] - sol[..., vc.size(-1) :] @ state  # (b, h, l, dv): what each position writes
        scores = (qc @ kc.transpose(-2, -1)) * decay  # (b, h, l, l): masked, like causal attention
        ys.append(scores @ u + (qc * start_decay) @ state)
        to_end = (cum[..., -1:] - cum).exp()[..., None]  # (b, h, l, 1): decay from each position to the chunk's end
        state = state * cum[..., -1, None, None].exp() + (kc * to_end).transpose(-2, -1) @ u
    return torch.cat(ys, dim=2).to(dtype), state
