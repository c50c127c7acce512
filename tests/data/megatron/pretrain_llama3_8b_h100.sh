#!/bin/bash
# Llama-3 8B pretraining on 2 nodes x 8 H100, written in the style of Megatron-LM's
# examples/*/train_*_distributed.sh (bash arrays expanded into one torchrun call).
# tune-cp test data: parse_megatron_args must read the flags inside the arrays.

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
NUM_NODES=2
CHECKPOINT_PATH=/lustre/ckpt/llama3-8b
DATA_PATH=/lustre/data/llama3_text_document

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr $MASTER_ADDR
    --master_port 6000
)

MODEL_ARGS=(
    --use-mcore-models
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --kv-channels 128
    --swiglu
    --normalization RMSNorm
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --position-embedding-type rope
    --rotary-base 500000
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --max-position-embeddings 8192
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 128
    --seq-length 8192
    --train-iters 500000
    --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine --lr-warmup-iters 2000
    --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0
    --bf16
    --recompute-granularity selective
    --recompute-modules core_attn layernorm
)

PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 2
    --context-parallel-size 2
    --sequence-parallel
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --cp-comm-type a2a
)

DATA_ARGS=(
    --data-path $DATA_PATH
    --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model meta-llama/Meta-Llama-3-8B
    --split 99,1,0
)

LOGGING_ARGS=(
    --log-interval 10
    --save-interval 1000
    --eval-interval 1000
    --save $CHECKPOINT_PATH
    --load $CHECKPOINT_PATH
    --tensorboard-dir "/lustre/tb/llama3 8b"
    --straggler-report-interval=50
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${PARALLEL_ARGS[@]} \
    ${DATA_ARGS[@]} \
    ${LOGGING_ARGS[@]} 2>&1 | tee train.log
