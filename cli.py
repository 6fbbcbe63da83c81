"""Entry point: ``python cli.py fit --config configs/quickstart.yaml`` or ``python cli.py compare --config ...``."""

from fl_lightning.cli import main

if __name__ == "__main__":
    main()
