/* pool_tree.c — the AVL trees that hold free blocks: one per sub-pool for
 * the blocks no bin takes, and one per size bin (pool_internal.h:
 * pool_free_insert).  Keyed by (size, addr), so best fit is the leftmost
 * block not smaller than the request, and among equal sizes the lowest
 * address wins, which keeps live memory packed toward segment starts. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* for clock_gettime etc. under -std=c11 */
#endif
#include "pool_internal.h"

static inline int32_t avl_h(const pool_block *b) { return b ? b->height : 0; }

static inline void avl_fix(pool_block *b)
{
    int32_t l = avl_h(b->left), r = avl_h(b->right);
    b->height = 1 + (l > r ? l : r);
}

static pool_block *avl_rot_right(pool_block *y)
{
    pool_block *x = y->left;
    y->left = x->right;
    x->right = y;
    avl_fix(y);
    avl_fix(x);
    return x;
}

static pool_block *avl_rot_left(pool_block *x)
{
    pool_block *y = x->right;
    x->right = y->left;
    y->left = x;
    avl_fix(x);
    avl_fix(y);
    return y;
}

static pool_block *avl_balance(pool_block *n)
{
    avl_fix(n);
    int32_t bf = avl_h(n->left) - avl_h(n->right);
    if (bf > 1) {
        if (avl_h(n->left->left) < avl_h(n->left->right))
            n->left = avl_rot_left(n->left);
        return avl_rot_right(n);
    }
    if (bf < -1) {
        if (avl_h(n->right->right) < avl_h(n->right->left))
            n->right = avl_rot_right(n->right);
        return avl_rot_left(n);
    }
    return n;
}

/* Insert and remove walk down recording the links they passed, then
 * rebalance upward only until a subtree keeps its height: above that point
 * nothing changed.  Most updates stop within a level or two, which is what
 * makes the tree updates cheap. */
#define AVL_MAX_DEPTH 96 /* AVL height <= 1.44 log2(n + 2): enough for any n */

static void avl_rebalance_up(pool_block **path[], int d)
{
    while (d > 0) {
        pool_block **link = path[--d];
        int32_t old = (*link)->height;
        *link = avl_balance(*link);
        if ((*link)->height == old)
            break;
    }
}

void pool_avl_insert(pool_block **root, pool_block *n)
{
    pool_block **path[AVL_MAX_DEPTH];
    int d = 0;
    pool_block **link = root;
    while (*link) {
        path[d++] = link;
        link = pool_blk_less(n, *link) ? &(*link)->left : &(*link)->right;
    }
    n->left = n->right = NULL;
    n->height = 1;
    *link = n;
    avl_rebalance_up(path, d);
}

void pool_avl_remove(pool_block **root, pool_block *n)
{
    pool_block **path[AVL_MAX_DEPTH];
    int d = 0;
    pool_block **link = root;
    while (*link != n) {
        path[d++] = link;
        link = pool_blk_less(n, *link) ? &(*link)->left : &(*link)->right;
    }
    if (!n->left || !n->right) {
        *link = n->left ? n->left : n->right;
    } else {
        /* Put n's successor (the leftmost of its right subtree) in its place. */
        int at = d;
        path[d++] = link;
        pool_block **ml = &n->right;
        while ((*ml)->left) {
            path[d++] = ml;
            ml = &(*ml)->left;
        }
        pool_block *m = *ml;
        *ml = m->right;
        m->left = n->left;
        m->right = n->right;
        m->height = n->height;
        *link = m;
        /* The link recorded as n->right now lives in m. */
        if (d > at + 1)
            path[at + 1] = &m->right;
    }
    avl_rebalance_up(path, d);
}
