# PyTorch Lightning: a small regression model, Trainer.fit with a validation loop and the progress bar.
import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

L.seed_everything(0)
x = torch.randn(1280, 32)
y = x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(1280, 1)
train = DataLoader(TensorDataset(x[:1024], y[:1024]), batch_size=64, shuffle=True)  # 16 steps an epoch
val = DataLoader(TensorDataset(x[1024:], y[1024:]), batch_size=64)


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                 nn.Linear(256, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1)
trainer.fit(Regressor(), train, val)
