"""Attacks: the plugin base class and factory (:mod:`advopenood.attacks.base`) and the content-addressed store
of adversarial sets (:mod:`advopenood.attacks.store`). ``from advopenood.attacks import Attack`` is the path an
attack plugin uses."""
from advopenood.attacks.base import (
    Attack,
    attack_params,
    build_attack,
    default_eps,
    foolbox_model,
    frozen,
)

__all__ = ["Attack", "attack_params", "build_attack", "default_eps", "foolbox_model", "frozen"]
