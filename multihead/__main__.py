from multihead.cli.main import run

run()
