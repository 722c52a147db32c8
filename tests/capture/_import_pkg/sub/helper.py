K = 5


def twice(x):
    return x * 2
