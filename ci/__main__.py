from alloctrace.ci import SCRIPT

print(SCRIPT)
