"""Example third-party detector written against OpenOOD's postprocessor interface only."""
import torch


class NegEntropy:
    """Negative predictive entropy, sum_k p_k log p_k (higher = more in-distribution)."""

    def setup(self, net, id_loader_dict, ood_loader_dict):
        pass

    @torch.no_grad()
    def postprocess(self, net, data):
        p = torch.softmax(net(data), dim=1)
        return p.argmax(1), (p * torch.log(p.clamp_min(1e-12))).sum(1)
