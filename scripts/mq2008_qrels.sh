#!/usr/bin/env bash
# MQ2008's expert labels as TREC qrels (`qid 0 docid label`), read from its LETOR file's `#docid`
# comments: the judgments the MQ2008-based experiments score rankings against.
#
# usage: scripts/mq2008_qrels.sh [LETOR_FILE] > labels.qrels   (default: data/mq2008/S1.txt.gz)
set -euo pipefail
zcat -f "${1:-data/mq2008/S1.txt.gz}" | awk '{ for (i = 1; i <= NF; i++) if ($i == "#docid") { split($2, q, ":"); print q[2], 0, $(i + 2), $1 } }'
