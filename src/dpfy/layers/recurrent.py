"""``DPRNN``, ``DPGRU``, ``DPLSTM``: drop-in recurrent layers whose weights are ``nn.Linear``\\ s.

Same constructor, call signature, outputs and ``state_dict`` keys as ``nn.RNN`` / ``nn.GRU`` /
``nn.LSTM`` (multi-layer, bidirectional, ``batch_first`` either way, with or without bias, initial
states, unbatched inputs, ``PackedSequence`` inputs of variable lengths, dropout between
layers). Each direction of each layer holds two Linears, ``ih`` (W_ih, b_ih) and ``hh`` (W_hh,
b_hh), each called once per forward on a whole sequence (``dpfy.layers.scan``), so the private
engine's Linear rule gives their exact per-example gradients. Not supported: LSTM ``proj_size``.

:meth:`DPRecurrent.from_module` builds one that *shares* the parameters of an existing
``nn.RNN``/``nn.GRU``/``nn.LSTM`` (same ``nn.Parameter`` objects): an optimizer built over the
old module keeps working after :func:`dpfy.layers.swap_recurrent`.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from dpfy._require import require
from dpfy.grads.rules.recurrent_linear import RecurrentLinear
from dpfy.layers.scan import GATES, run_direction

__all__ = ["DPRecurrent", "DPRNN", "DPGRU", "DPLSTM"]


class _Direction(nn.Module):
    """The two Linears of one direction of one layer."""

    def __init__(self, d_in: int, hidden: int, gates: int, bias: bool, **factory: Any) -> None:
        super().__init__()
        self.ih = nn.Linear(d_in, gates * hidden, bias=bias, **factory)
        self.hh = RecurrentLinear(hidden, gates * hidden, bias=bias, **factory)


def _torch_name(kind: str, layer: int, reverse: bool) -> str:
    return f"{kind}_l{layer}{'_reverse' if reverse else ''}"


class DPRecurrent(nn.Module):
    """Common body of :class:`DPRNN`, :class:`DPGRU` and :class:`DPLSTM` (see module doc)."""

    kind = ""  # one of dpfy.layers.scan.CELL_KINDS (DPRNN: from ``nonlinearity``)
    torch_type: type[nn.RNNBase] = nn.RNNBase

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        require(num_layers >= 1, f"{name}.num_layers", num_layers, ">= 1")
        require(0 <= dropout <= 1, f"{name}.dropout", dropout, "in [0, 1]")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = 0
        dirs = 2 if bidirectional else 1
        factory = {"device": device, "dtype": dtype}
        self.cells = nn.ModuleList(
            _Direction(
                input_size if k < dirs else hidden_size * dirs,
                hidden_size,
                GATES[self.kind],
                bias,
                **factory,
            )
            for k in range(num_layers * dirs)
        )
        self.reset_parameters()
        self._register_state_dict_hook(_to_torch_keys)
        self._register_load_state_dict_pre_hook(_from_torch_keys, with_module=True)

    def reset_parameters(self) -> None:
        """torch's initialization: every weight and bias U(−1/√H, 1/√H)."""
        bound = self.hidden_size**-0.5
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def torch_names(self) -> dict[str, str]:
        """{our parameter name: the nn.RNN/GRU/LSTM name} (``cells.0.ih.weight`` ->
        ``weight_ih_l0``)."""
        out = {}
        for k in range(len(self.cells)):
            layer, reverse = divmod(k, self.num_directions)
            for lin in ("ih", "hh"):
                for kind in ("weight", "bias") if self.bias else ("weight",):
                    out[f"cells.{k}.{lin}.{kind}"] = _torch_name(
                        f"{kind}_{lin}", layer, bool(reverse)
                    )
        return out

    @classmethod
    def from_module(cls, m: nn.RNNBase) -> "DPRecurrent":
        """A layer computing what ``m`` computes, sharing its ``nn.Parameter`` objects."""
        require(
            type(m) is cls.torch_type, "module", type(m).__name__, f"an {cls.torch_type.__name__}"
        )
        require(
            getattr(m, "proj_size", 0) == 0,
            f"{type(m).__name__}.proj_size",
            m.proj_size,
            "0 for a DP replacement",
            "Add an nn.Linear after the LSTM instead of proj_size",
        )
        kwargs = {"nonlinearity": m.nonlinearity} if isinstance(m, nn.RNN) else {}
        with torch.device("meta"):  # no memory for parameters that are replaced below
            new = cls(
                m.input_size,
                m.hidden_size,
                m.num_layers,
                m.bias,
                m.batch_first,
                m.dropout,
                m.bidirectional,
                **kwargs,
            )
        for ours, theirs in new.torch_names().items():
            mod_path, attr = ours.rsplit(".", 1)
            setattr(new.get_submodule(mod_path), attr, getattr(m, theirs))
        new.train(m.training)
        return new

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        for k, default in (
            ("bias", True),
            ("batch_first", False),
            ("dropout", 0.0),
            ("bidirectional", False),
        ):
            if getattr(self, k) != default:
                s += f", {k}={getattr(self, k)}"
        return s

    # -- forward ---------------------------------------------------------------------------
    def forward(self, input: torch.Tensor | PackedSequence, hx: Any = None):
        mask = None
        lengths: torch.Tensor | None
        if isinstance(input, PackedSequence):
            x, lengths = pad_packed_sequence(input, batch_first=True)  # original batch order
            steps = torch.arange(x.shape[1])
            mask = (steps[None, :] < lengths[:, None]).to(x.device)  # (B, T)
            unbatched = False
        else:
            unbatched = input.dim() == 2
            x = input.unsqueeze(0 if self.batch_first else 1) if unbatched else input
            x = x if self.batch_first else x.transpose(0, 1)  # (B, T, d)
            lengths = None
        b = x.shape[0]
        h0, c0 = self._initial_states(hx, b, x, unbatched)
        h_n: list[torch.Tensor] = []
        c_n: list[torch.Tensor] = []
        layer_in = x
        for layer in range(self.num_layers):
            outs = []
            for d in range(self.num_directions):
                k = layer * self.num_directions + d
                cell = self.cells[k]
                assert isinstance(cell, _Direction), "self.cells holds _Direction modules"
                xin = layer_in if d == 0 else _reverse(layer_in, lengths)
                out, h, c = run_direction(
                    self.kind, cell.ih, cell.hh, xin, h0[k], None if c0 is None else c0[k], mask
                )
                outs.append(out if d == 0 else _reverse(out, lengths))
                h_n.append(h)
                if c is not None:  # an LSTM's cell state; the other kinds have none
                    c_n.append(c)
            layer_in = outs[0] if len(outs) == 1 else torch.cat(outs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_in = F.dropout(layer_in, self.dropout, training=True)
        h_n_t = torch.stack(h_n)  # (L·D, B, H)
        state: Any = h_n_t if self.kind != "lstm" else (h_n_t, torch.stack(c_n))
        if isinstance(input, PackedSequence):
            assert lengths is not None, "a packed input's lengths were read above"
            return _repack(layer_in, lengths, input), state
        out = layer_in if self.batch_first else layer_in.transpose(0, 1)
        if unbatched:
            out = out.squeeze(0 if self.batch_first else 1)
            state = state.squeeze(1) if self.kind != "lstm" else tuple(s.squeeze(1) for s in state)
        return out, state

    def _initial_states(
        self, hx: Any, b: int, x: torch.Tensor, unbatched: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        shape = (self.num_layers * self.num_directions, b, self.hidden_size)
        if hx is None:
            z = x.new_zeros(shape)
            return z, (x.new_zeros(shape) if self.kind == "lstm" else None)
        hs = hx if self.kind == "lstm" else (hx, None)
        require(
            isinstance(hs, tuple) and len(hs) == 2,
            f"{type(self).__name__} hx",
            type(hx).__name__,
            "a tuple (h_0, c_0)" if self.kind == "lstm" else "a tensor",
        )
        h0, c0 = hs
        if unbatched:
            h0, c0 = h0.unsqueeze(1), (None if c0 is None else c0.unsqueeze(1))
        for t in (h0, c0):
            if t is not None:
                require(
                    tuple(t.shape) == shape,
                    f"{type(self).__name__} initial state shape",
                    tuple(t.shape),
                    f"{shape} (num_layers·directions, batch, hidden)",
                )
        return h0, c0


def _reverse(x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """Each sequence of x (B, T, d) reversed within its length (the rest stays in place)."""
    if lengths is None:
        return x.flip(1)
    t = torch.arange(x.shape[1])
    idx = torch.where(
        t[None, :] < lengths[:, None], lengths[:, None] - 1 - t[None, :], t[None, :]
    )  # (B, T)
    return x.gather(1, idx.unsqueeze(-1).expand_as(x).to(x.device))


def _repack(out: torch.Tensor, lengths: torch.Tensor, like: PackedSequence) -> PackedSequence:
    """``out`` (B, T, H) in the original batch order packed like the input ``like``."""
    order = like.sorted_indices
    if order is not None:
        out, lengths = out[order.to(out.device)], lengths[order.cpu()]
    data = pack_padded_sequence(out, lengths, batch_first=True, enforce_sorted=True).data
    return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)


_OURS = re.compile(r"^(.*)cells\.(\d+)\.(ih|hh)\.(weight|bias)$")
_THEIRS = re.compile(r"^(.*)(weight|bias)_(ih|hh)_l(\d+)(_reverse)?$")


def _to_torch_keys(module: DPRecurrent, state: dict, prefix: str, local: Any) -> None:
    """state_dict hook: our keys become nn.RNN/GRU/LSTM keys (``weight_ih_l0`` ...)."""
    for ours, theirs in module.torch_names().items():
        if prefix + ours in state:
            state[prefix + theirs] = state.pop(prefix + ours)


def _from_torch_keys(module: DPRecurrent, state: dict, prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook: nn.RNN/GRU/LSTM keys are read as ours."""
    for ours, theirs in module.torch_names().items():
        if prefix + theirs in state:
            state[prefix + ours] = state.pop(prefix + theirs)


class DPRNN(DPRecurrent):
    """Drop-in ``nn.RNN`` (``nonlinearity`` "tanh" or "relu") for private training."""

    torch_type = nn.RNN

    def __init__(self, *args: Any, nonlinearity: str = "tanh", **kwargs: Any) -> None:
        require(
            nonlinearity in ("tanh", "relu"), "DPRNN.nonlinearity", nonlinearity, "'tanh' or 'relu'"
        )
        self.nonlinearity = nonlinearity
        self.kind = f"rnn_{nonlinearity}"
        super().__init__(*args, **kwargs)


class DPGRU(DPRecurrent):
    """Drop-in ``nn.GRU`` for private training."""

    kind = "gru"
    torch_type = nn.GRU


class DPLSTM(DPRecurrent):
    """Drop-in ``nn.LSTM`` (without ``proj_size``) for private training."""

    kind = "lstm"
    torch_type = nn.LSTM
