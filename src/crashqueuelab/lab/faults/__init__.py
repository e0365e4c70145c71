"""How a run is broken (the lab's nemesis): the vocabulary of faults (``kinds``), and the
deliverers that strike them in one shape (``delivery``: kills and pauses in ``signals``,
power cuts in ``powercut``, server restarts and ended sessions in ``server``, network
windows in ``network/deliverer``); crash hooks and crash children (``hooks``,
``children``), the two crash modes (``crashmodes``), lost replies at a COMMIT
(``lostreplies``), the fault proxy (``network/``) and the power-loss disk (``powerloss/``)."""
