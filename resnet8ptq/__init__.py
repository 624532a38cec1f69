"""resnet8ptq."""
