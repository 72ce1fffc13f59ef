"""The pixel scale every model input has: one contract for training's transforms and the test-time views.

It sits in the numeric core because judging a model also makes inputs (TTA views, their border fill), and those
must match what the network was trained on to the last bit; training's transforms read it from here.
"""

GRAY_MEAN = 0.449  # mean of ImageNet's RGB means
GRAY_STD = 0.226  # mean of ImageNet's RGB stds
