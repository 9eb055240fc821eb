"""The traced slow paths of the annotations, run while a session is active.

The C core answers annotations directly when no session runs; with one, it
calls into SessionAPI.  Node contexts, ports, the op log and provenance live
in C objects (leapp._core.Node / Port / Carrier); this module walks payloads,
raises the clear errors, and drives the node lifecycle:

  pass 1 of a node: input_tensors declares ports and returns traced values,
  ops are recorded by the C handler, output_tensors prunes, builds the
  GraphModule, publishes the output ports and closes the node;
  later passes: the same calls check the structure against pass 1, fill in a
  missing source (inferred feedback) and cache samples for validation.

SessionAPI is the one object the C core calls; its sides do the work: the
inputs (leapp.tracing.node_inputs), the outputs and the tail of late updates
(leapp.tracing.session_outputs) and declared state (leapp.tracing.declared_state:
state_tensors / update_state / register_buffer / module).  Next to them:
origins (call sites, re-run detection), method (@annotate.method) and mirror
(mirror_leapp_tags).
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from . import method as _method, mirror as _mirror
from .. import _core
from ..bundle.log import fatal, logger
from .declared_state import DeclaredState
from .node_info import info  # noqa: F401  (the compiling stage reads nodes' info here)
from .node_inputs import NodeInputs
from .origins import call_site, check_origin
from .payload import normalize, rebuild
from .session_checks import thread_text
from .session_outputs import NodeOutputs


class SessionAPI:
    """The annotations' implementation while a session runs: one object whose public
    methods the C core calls, each handing the work to its side (NodeInputs,
    NodeOutputs, DeclaredState), which reach each other only through public methods."""

    def __init__(self) -> None:
        self.inputs = NodeInputs()
        self.outputs = NodeOutputs(self)
        self.state = DeclaredState(self)

    # ---- threads --------------------------------------------------------------

    def refuse_thread(self, what: str) -> None:
        """Raise the error for a session call from a thread that does not own it.

        A session traces the thread that called leapp.start(): node contexts
        and their op logs are per session, not per thread, so another thread's
        annotations or ops on traced values would interleave with the owner's
        records.  The C core calls this for annotations, @annotate.method calls
        and traced ops coming from another thread while a session runs.
        """
        owner = _core.session_thread()
        fatal(f"{what} was called from thread {thread_text(threading.get_ident())} while the "
              f"LEAPP tracing session belongs to thread {thread_text(owner)}, the thread that "
              f"called leapp.start(). A session traces one thread: run the annotated code, "
              f"and the torch ops on its traced values, in that thread (several nodes may be "
              f"traced there one after another), or call leapp.stop() there before other "
              f"threads use the annotations.")


    # ---- the annotations: each a door into the side that does the work ----

    def input_tensors(self, node_name: str, tensors: Any, _origin: Any = None) -> Any:
        """Declare node inputs; returns traced values (plain ones on re-entry)."""
        values, fields = normalize("input_tensors", node_name, tensors)
        if not _core.is_tracing():
            return rebuild(values, {})
        node = _core.find_node(node_name) or self.inputs.new_node(node_name)
        check_origin(node, _origin if _origin is not None else call_site())
        return self.inputs.declare(node, values, fields, state=False)

    def output_tensors(self, node_name: str, tensors: Any, static_outputs: Any = None,
                       export_with: str | None = None, backend_params: dict | None = None,
                       **kwargs: Any) -> Any:
        """Finish the node (pass 1) or check and cache its outputs (later passes)."""
        return self.outputs.output_tensors(node_name, tensors, static_outputs, export_with,
                                           backend_params, **kwargs)

    def state_tensors(self, node_name: str, tensors: Any) -> Any:
        """Declare state inputs of the node; updated ones become feedback."""
        return self.state.state_tensors(node_name, tensors)

    def update_state(self, node_name: str, tensors: Any) -> Any:
        """Bind the new values of declared states (feedback outputs)."""
        return self.state.update_state(node_name, tensors)

    def register_buffer(self, node_name: str, tensors: Any) -> Any:
        """Persistent tensors of the node that traced code may write in place."""
        return self.state.register_buffer(node_name, tensors)

    def module(self, node_name: str, model: torch.nn.Module,
               buffer_names: list[str] | None = None) -> None:
        """Track the registered buffers of model while the node traces."""
        return self.state.module(node_name, model, buffer_names)

    def close_tails(self) -> None:
        """End every node's tail (stop(): updates that never came)."""
        self.outputs.close_tails()

    # ---- their own modules: provenance (_mirror), @annotate.method (_method) ----
    # The C core looks both up on this object by name.

    mirror_leapp_tags = staticmethod(_mirror.mirror_leapp_tags)
    # Called as API.call_method(method, args, kwargs): the session API is its first argument.
    call_method = _method.call_method


API = SessionAPI()


def check_session_thread(what: str) -> None:
    """Refuse what (e.g. 'leapp.stop()') outside the thread owning the running session."""
    owner = _core.session_thread()
    if owner is None or owner == threading.get_ident():
        return
    if all(thread.ident != owner for thread in threading.enumerate()):
        logger.warning("%s: the thread that started the session has ended; the session is "
                       "handed to thread %s.", what, thread_text(threading.get_ident()))
        return
    API.refuse_thread(what)
