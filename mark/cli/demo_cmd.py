"""`mark demo`: build the offline demo model."""

from __future__ import annotations

from pathlib import Path

import typer

from mark.cli.context import console

app = typer.Typer(help="The offline demo model (a CNN on scikit-learn's digits).")


@app.command("build")
def build(
    out: Path | None = typer.Option(None, help="where to write the TorchScript file"),
    seed: int = typer.Option(0, help="training seed (same seed, same model)"),
    epochs: int = typer.Option(15, min=1, max=500),
) -> None:
    """Train the demo CNN, print its held-out accuracy, save it as TorchScript."""
    from mark.demo import default_model_path, save_torchscript, train_digits  # imports torch

    path = out or default_model_path()
    with console.status(f"training the digits CNN ({epochs} epochs)..."):
        trained = train_digits(seed=seed, epochs=epochs)
    save_torchscript(trained.model, path)
    console.print(
        f"test accuracy {trained.test_accuracy:.1%} on {trained.test_size} held-out images "
        f"(trained on {trained.train_size}); saved to {path}"
    )
