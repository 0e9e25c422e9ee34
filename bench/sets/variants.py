"""The families with one thing changed each, one batch size each: cases no model of the planner was fitted or checked on (`--set variants`)."""
from .families import RNNClassifier, _tv

# the same families with one thing changed each, for checking the plan on cases no model of the planner was fitted or checked on:
# the recurrent nets, whose tensors share glibc's heap with the graph's objects (the hardest case), and two convolutional nets at other sizes
RNN = lambda kind, **kw: (lambda: RNNClassifier(kind, **kw))
MODELS = {'gru_1layer': (RNN('gru', layers=1), (64, 64), (32,)), 'gru_3layer': (RNN('gru', layers=3), (64, 64), (32,)),
            'gru_48steps': (RNN('gru'), (48, 64), (32,)), 'gru_d96': (RNN('gru', d=96), (64, 64), (32,)), 'gru_d160': (RNN('gru', d=160), (64, 64), (32,)),
            'rnn_tanh': (RNN('rnn'), (64, 64), (32,)), 'lstm_1layer': (RNN('lstm', layers=1), (64, 64), (32,)), 'lstm_32steps': (RNN('lstm'), (32, 64), (32,)),
            'lstm_d96': (RNN('lstm', d=96), (64, 64), (32,)), 'bigru_d64_in32': (RNN('gru', d=64, bidirectional=True, inputs=32), (64, 32), (32,)),
            'gru_b24': (RNN('gru'), (64, 64), (24,)), 'resnet18_96px': (_tv('resnet18'), (3, 96, 96), (8,)), 'mobilenet_v2_32px': (_tv('mobilenet_v2'), (3, 32, 32), (32,)),
            'resnet18_32px': (_tv('resnet18'), (3, 32, 32), (32,))}  # CIFAR-size images: its last stage runs at 1x1, where the weights outweigh the activations
