"""Entry point: ``python cli.py fit --config configs/quickstart.yaml``."""

from fl_lightning.cli import cli_main

if __name__ == "__main__":
    cli_main()
