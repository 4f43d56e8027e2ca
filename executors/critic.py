"""PPO's value model (the `critic` role): values for GAE, trained on returns.

One process trains the whole value model unless the plan's critic layout has context
parallelism (`RunConfig.critic_cp`, cp > 1): then the critic's first cp ranks form one process
group (`executors.procgroup`, as the trainer's), the mesh ("dp", "cp", "tp") of dp 1 and tp 1
(`executors.sharding.build_mesh`), and each rank runs a slice of every sequence, as the
actor's CP ranks do (`executors.cpattn`):

  forward   the backbone runs this rank's columns (Megatron's 2 * cp load-balanced chunks),
            each layer's attention gathering the CP group's keys and values; the value head
            reads the rank's own hidden states, so each rank holds the values of the response
            positions its columns predict (zeros elsewhere: `cpattn.spread`). `values` sums
            them over the group: every CP rank returns the whole batch's.
  loss      the clipped value loss of the rank's own positions over the whole batch's
            response tokens (`rl.value_loss`'s denominator), so the CP group's losses add up to
            the one-process loss; its gradient is the rank's share, summed over "cp" by FSDP2
            over the flattened ("dp", "cp") mesh (`executors.sharding.shard`), clipped by the
            global norm over the shards (`sharding.clip_grad_norm`).
  positions the one-process value model reads the backbone's own positions (column indices,
            left padding counted in: `ValueModel.forward` passes no position ids), so each CP
            slice rotates its columns by their column index, as one process does.

The role's other ranks stand by. The forward computes in the job's training precision
(`cfg.precision`: BF16 autocast over FP32 weights and Adam, as the actor trains); layers
recompute their activations when the plan's critic layout says so. A checkpoint is one file in
the one-process format (one process), or a CP group's folder of each rank's own shards
(`executors.shardckpt`: nothing gathered onto rank 0); either restores into any critic layout.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from executors import rl, shardckpt
from executors.cpattn import (
    CP_MESH_ATTR,
    CPRank,
    cp_inputs,
    cp_piece,
    cp_rank_of,
    cp_sum,
    enable_cp,
    response_columns,
    spread,
)
from executors.layoutread import read_layout
from executors.model import ValueModel
from executors.precision import autocast
from executors.procgroup import GroupMember
from executors.roles import RunConfig, Worker, _timing, save_checkpoint
from executors.runplan import Layout
from executors.sharding import (
    build_mesh,
    clip_grad_norm,
    full_state,
    recompute_layers,
    recomputes,
    shard,
)


class Critic(Worker, GroupMember):
    """PPO's value model: one process, or a CP group of `cfg.critic_cp` ranks."""

    def __init__(self, cfg: RunConfig, rank: int = 0, world: int = 1) -> None:
        super().__init__(cfg, "critic", rank)
        self.world = world
        # the ranks a CP critic trains on (the others stand by); one without CP
        self.layout = Layout(cp=cfg.critic_cp) if world > 1 and cfg.critic_cp > 1 else Layout()
        if self.layout.cp > world:
            raise ValueError(f"critic: cp {self.layout.cp} needs {self.layout.cp} ranks, "
                             f"the run made {world}")
        self.model = ValueModel(cfg.model_arch, cfg.seed + 29)
        if cfg.critic_recompute:
            recompute_layers(self.model)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.critic_lr)
        self._cp: CPRank | None = None  # this rank's place in the CP group (once joined)

    @property
    def trains(self) -> bool:
        """Whether this rank takes part in the critic's work (a CP rank, or the one process)."""
        return self.rank < self.layout.cp

    def init_group(self, addr: str, port: int) -> bool:
        """Join the critic's CP group (its first cp ranks) and shard the value model over it:
        FSDP2 over ("dp", "cp"), attention gathering over "cp"."""
        if self.layout.cp == 1 or not self.trains:
            return True
        self.world = self.layout.cp
        self.join_group(addr, port)
        self.model = ValueModel(self.cfg.model_arch, self.cfg.seed + 29)
        mesh = build_mesh(self.layout)
        enable_cp(self.model.backbone, mesh["cp"])
        setattr(self.model, CP_MESH_ATTR, mesh["cp"])
        shard(self.model, mesh, recompute=self.cfg.critic_recompute, precision=self.cfg.precision)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=self.cfg.critic_lr)
        self._cp = cp_rank_of(self.model)
        return True

    def executed_layout(self, ranks: int) -> dict[str, Any]:
        """The layout read off the built value model: one process, or its CP group's mesh."""
        if self._cp is None:
            return {"dp": 1, "tp": 1, "pp": 1, "recompute": recomputes(self.model)}
        read = read_layout(self.model)
        if read.get("cp", 1) != self.layout.cp:
            raise RuntimeError(f"critic rank {self.rank}: the built model runs cp "
                               f"{read.get('cp', 1)} (plan: {self.layout.cp})")
        return {k: read[k] for k in ("dp", "cp", "tp", "pp", "recompute", "mesh")}

    def _values(self, s: rl.Samples) -> tuple[torch.Tensor, torch.Tensor]:
        """(values at the response positions in FP32, the mask of the positions this rank
        computed: the whole response mask in one process), in the job's training precision
        (BF16 autocast over the FP32 weights, as the actor: `executors.precision`)."""
        _, _, rmask = rl.pack(s)
        with autocast(self.cfg.precision):
            if self._cp is None:
                return rl.response_values(self.model, s).float(), rmask
            v, own = self._cp_values(s)
        return v.float(), own

    def _cp_values(self, s: rl.Samples) -> tuple[torch.Tensor, torch.Tensor]:
        """This CP rank's share of `rl.response_values` and the mask of its positions."""
        assert self._cp is not None
        ids, mask, rmask = rl.pack(s)
        width = ids.shape[1]
        ids, mask, cols = cp_inputs(ids, mask, self._cp)
        dev = next(self.model.parameters()).device
        pos = cols[None].expand(ids.shape[0], -1)  # the backbone's own: column indices
        v = self.model(ids.to(dev), None, position_ids=pos.to(dev),  # through FSDP's root
                       cp_slice=cp_piece(self._cp, mask)).float().cpu()
        resp, mine = response_columns(cols, rmask.shape[1], width)
        out, _, own = spread(v, None, resp, mine, rmask)
        return out, own

    @torch.no_grad()
    def values(self, s: rl.Samples) -> tuple[list[list[float]], dict]:
        t0 = time.time()
        v, _ = self._values(s)
        if self._cp is not None:  # every CP rank holds the whole batch's
            v = cp_sum(v, self._cp.group)
        rows = [v[i, :len(r)].tolist() for i, r in enumerate(s.responses)]
        return rows, _timing(t0, tokens=s.tokens(), sample_ids=s.ids)

    def train(self, s: rl.Samples, returns: list[list[float]], old: list[list[float]]
              ) -> tuple[dict, dict]:
        t0 = time.time()
        self.opt.zero_grad()
        v, own = self._values(s)
        _, _, rmask = rl.pack(s)
        w = rmask.shape[1]
        loss = rl.value_loss(v, rl.to_padded(old, w), rl.to_padded(returns, w), own,
                             denom=float(rmask.sum()))
        loss.backward()
        if self._cp is None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            value = float(loss.detach())
        else:
            clip_grad_norm(list(self.model.parameters()), 1.0)
            value = float(cp_sum(loss.detach().reshape(1), self._cp.group))
        self.opt.step()
        return {"value_loss": value}, _timing(t0, tokens=s.tokens(), sample_ids=s.ids)

    def weights(self) -> dict[str, torch.Tensor]:
        """The full weights on the CPU (sharded: a collective of the CP group; rank 0 keeps
        them, the others get an empty dict)."""
        if self._cp is None:
            return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        return full_state(self.model, keep=self.rank == 0)

    def save(self, path: str, step: int) -> str:
        """A checkpoint any critic layout restores. One process: one file in the one-process
        format. A CP group: a folder of each rank's own shards (`executors.shardckpt`, as the
        trainer's: nothing gathered onto rank 0); every CP rank calls it (a collective)."""
        if self._cp is None:
            return save_checkpoint(path, {"model": self.model.state_dict(),
                                          "optim": self.opt.state_dict(), "step": step})
        sd = self.opt.state_dict()
        state: dict[tuple[Any, ...], Any] = {
            ("model", k): v for k, v in self.model.state_dict().items()}
        state.update({("optim", int(i), k): v for i in sorted(sd["state"])
                      for k, v in sorted(sd["state"][i].items())})
        return shardckpt.save(path, self.rank, self.layout.cp, state, {
            "version": None, "step": step, "optimizer_steps": None,
            "param_groups": sd["param_groups"]})

    def load(self, path: str) -> int:
        """Restore a checkpoint written by any critic layout (a file, or a CP group's folder
        of rank files, `shardckpt.load`) into this one."""
        ck = shardckpt.load(path)
        if self._cp is None:
            self.model.load_state_dict(ck["model"])
            self.opt.load_state_dict(ck["optim"])
        else:
            shardckpt.load_full(self.model, ck["model"])
            shardckpt.load_sharded_optim(self.opt, ck["optim"])
        return int(ck["step"])
