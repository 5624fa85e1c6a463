"""paws_tf's program from a checkout, the same as the installed `paws-tf`
(paws_tf/cli.py): `python run.py --help`."""

from paws_tf import cli

if __name__ == '__main__':
    cli.run()
