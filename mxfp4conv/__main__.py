from mxfp4conv.cli import main

main()
