"""``python -m twin.cli``: the same as the ``dctwin`` console script."""

from twin.cli import app

if __name__ == "__main__":
    app()
