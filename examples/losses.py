"""Common losses on one batch: MSE, Huber, hinge embedding, KL divergence, cross entropy."""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 128
num_classes = 1000


class Model(nn.Module):
    def forward(self, logits, targets, classes, signs):
        probs = F.softmax(targets, dim=1)
        return (F.mse_loss(logits, targets), F.huber_loss(logits, targets, delta=0.5),
                F.hinge_embedding_loss(logits, signs, margin=1.0),
                F.kl_div(F.log_softmax(logits, dim=1), probs, reduction="batchmean"),
                F.cross_entropy(logits, classes),
                F.cross_entropy(logits, classes, label_smoothing=0.1))


def get_inputs():
    logits = torch.randn(batch_size, num_classes)
    targets = torch.randn(batch_size, num_classes)
    classes = torch.randint(0, num_classes, (batch_size,))
    signs = torch.where(torch.rand(batch_size, num_classes) > 0.5, 1.0, -1.0)
    return [logits, targets, classes, signs]


def get_init_inputs():
    return []
