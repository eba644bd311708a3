"""Training workloads for co-location experiments, and the experiment driver.

The paper's kinds of networks (ResNet-50, VGG-16, AlexNet, an LSTM language
model, a small CNN) on synthetic data, reporting their steps through the job
lifecycle library; ``workloads.experiment`` runs them solo and co-located
while NVML is sampled, and turns the recordings into the observations CSV.
"""
