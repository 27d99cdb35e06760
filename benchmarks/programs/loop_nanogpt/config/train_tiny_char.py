# train a tiny character-level model on CPU, in a few seconds
# good for checking that the loop runs end to end

out_dir = 'out-tiny-char'
eval_interval = 10 # eval often: the run is short
eval_iters = 5
log_interval = 1 # one line an iteration

always_save_checkpoint = False

gradient_accumulation_steps = 1
batch_size = 16
block_size = 64 # context of up to 64 previous characters

# baby GPT model :)
n_layer = 2
n_head = 4
n_embd = 64
dropout = 0.0

learning_rate = 1e-3 # with baby networks can afford to go a bit higher
max_iters = 100
lr_decay_iters = 100 # make equal to max_iters usually
min_lr = 1e-4 # learning_rate / 10 usually
beta2 = 0.99 # make a bit bigger because number of tokens per iter is small

warmup_iters = 5 # not super necessary potentially
device = 'cpu'
compile = False
