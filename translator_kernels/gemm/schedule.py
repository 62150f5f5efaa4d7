"""The hot loop's instruction-order plan (kernel.py's K step, wide.py's): which LDS reads, MFMAs, global loads and
LDS writes the LLVM scheduler is asked to keep together (rocdl.sched_group_barrier groups)."""


def _spread(n: int, slots: int) -> list[int]:
    """n items over `slots` slots as evenly as integers allow (sums to n)."""
    return [(i + 1) * n // slots - i * n // slots for i in range(slots)] if slots > 0 else []


def hot_loop_schedule(n_ops: int, reads_per_op: int, mfma_per_op: int, n_vmem: int, n_dswr: int,
                  lead_ops: int = 2, extra_reads: dict | None = None,
                  vmem_at: list[int] | None = None) -> list[tuple[str, int]]:
    """The order the LLVM scheduler is asked to keep for one K step, as (kind, count) groups
    (kind: mfma | dsrd = LDS read | vmem = global load | dswr = LDS write).

    The step computes `n_ops` A operands (one (kb, mr) pair each), every operand `reads_per_op`
    ds_read_b128 then `mfma_per_op` MFMAs. The next tile's `n_vmem` global loads (A first) and
    `n_dswr` LDS writes of A ride along:
      - the reads of the first `lead_ops` operands go first, then each operand's first MFMA is
        followed by the reads of the operand `lead_ops` later: an A operand is read about
        lead_ops x mfma_per_op MFMAs before its use, and only ~lead_ops + 1 operands are live
        (left alone, the scheduler hoists every read to the top: 4 VGPRs per operand);
      - the global loads spread over the first half of the MFMAs, so their latency hides under
        the second half and the next step;
      - the LDS writes of A (each waits for its global load) follow the last MFMAs.
    extra_reads {operand: count}: LDS reads issued along with that operand's (wide.py: the W
    operands of a K block, with the block's first A operand). vmem_at: the global loads after each
    MFMA, in place of the spread (`ring_vmem`).
    """
    n_mfma = n_ops * mfma_per_op
    lead = min(lead_ops, n_ops)
    extra = extra_reads or {}
    vmem = list(vmem_at) + [0] * n_mfma if vmem_at else _spread(n_vmem, max(1, n_mfma // 2)) + [0] * n_mfma
    dswr_from = max(0, n_mfma - n_dswr)
    plan, dswr_left = [("dsrd", sum(reads_per_op + extra.get(j, 0) for j in range(lead)))], n_dswr
    for i in range(n_mfma):
        plan.append(("mfma", 1))
        j = i // mfma_per_op + lead
        if i % mfma_per_op == 0 and j < n_ops:
            plan.append(("dsrd", reads_per_op + extra.get(j, 0)))
        if vmem[i]:
            plan.append(("vmem", vmem[i]))
        if i >= dswr_from and dswr_left:
            plan.append(("dswr", 1))
            dswr_left -= 1
    if dswr_left:
        plan.append(("dswr", dswr_left))
    return plan


def ring_vmem(k_blk: int, mfma_per_blk: int, a_loads: int, w_per_blk: int) -> list[int]:
    """Global loads after each MFMA of a K step whose W registers are a ring (kernel.py `ring`): the next A tile
    with the first MFMA, the next tile's W block kb after the last MFMA of block kb (the registers it frees)."""
    plan = [0] * (k_blk * mfma_per_blk)
    plan[0] += a_loads
    for kb in range(k_blk):
        plan[(kb + 1) * mfma_per_blk - 1] += w_per_blk
    return plan
