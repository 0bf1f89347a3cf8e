"""Post-hoc OOD detectors: OpenOOD's postprocessor interface, two backends, and the shared pass.

Every detector follows OpenOOD's ``BasePostprocessor`` interface: ``setup(net, id_loader_dict,
ood_loader_dict)``, ``postprocess(net, data) -> (pred, conf)`` with *higher conf = more in-distribution*,
and ``inference(net, loader) -> (pred, conf, label)``. Two backends implement the 16 built-in detectors:

* ``openood`` (default when ``import openood`` works): OpenOOD's own postprocessor classes, built from our
  copies of its YAML configs (``advopenood/configs/openood/*.yml``), so OpenOOD never tries to download a
  config. Its hard-coded ``.cuda()`` calls are redirected to the run's device, and the network is wrapped
  in ``ReactNet`` / ``ASHNet`` / ``ScaleNet`` for REACT / ASH / SCALE exactly as OpenOOD's ``Evaluator`` does.
* ``pytorch-ood`` (always available): the same detectors from the pytorch-ood package with OpenOOD's default
  hyperparameters mapped (see ``plugins/detectors.py`` and docs/detectors.md).

:func:`score_all` scores every selected detector from *one* network pass per input batch (logits,
penultimate features and last-block maps are computed once and handed to each detector; GRAM reads every
tapped map of the same pass); only ODIN (input gradients) adds its own step. Fitting works the same way: one
pass over the fit set, shared by every detector that fits on ID data (GRAM keeps per-sample statistics of
the tapped maps, never the maps). With a :class:`~advopenood.detection.scorecache.ScoreCache`, the fit pass, fitted
states, each scored set's logits and features, and score vectors are read back instead of recomputed; under
``torchrun`` the fit pass and the scoring are sharded by batch over the ranks.
"""
