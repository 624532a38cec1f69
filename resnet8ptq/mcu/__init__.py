"""The microcontroller path of a TFLite model (`mcu`): its predictions in TensorFlow Lite Micro (TFLM), the
tensor arena and flash it needs, the boards it therefore fits, and Arm's Vela compiler's estimate for an
Ethos-U NPU. See docs/mcu.md."""
