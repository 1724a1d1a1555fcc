// attention.cu: causal grouped-query attention, FlashAttention-2 style,
// with the semantics of backend.Backend.AttentionForward/Backward (see
// backend.AttentionDims): q, out, dq, dout [B, Tq, NH, HD]; k, v, dk, dv
// [B, Tk, NKV, HD]; lse, D [B, NH, Tq]. Query i sits at position QPos+i,
// key j at KPos+j, and query i sees key j when KPos+j <= QPos+i. Query
// head h reads key/value head h / (NH/NKV).
//
// Blocks are ATT_WARPS warps (ATT_WARPS*32 threads). Keys are taken in
// tiles of ATT_BC = 32 staged in shared memory; in the forward and the dq
// kernels each warp owns one query row and lane l scores key l of the
// tile, while the head dimension (HD <= ATT_HD_MAX) is split over the
// lanes (dimension d belongs to lane d % 32). Nothing of size Tq × Tk is
// ever held; the backward recomputes each probability from q, k and the
// saved log-sum-exp. Every sum runs in an order fixed by the shapes, so
// results are deterministic (no atomics).
#include "common.cuh"

#define ATT_WARPS 4
#define ATT_BC 32
#define ATT_HD_MAX 128
#define ATT_DPL (ATT_HD_MAX / 32) // head dimensions per lane

struct AttDims {
	int B, Tq, Tk, NH, NKV, HD, QPos, KPos;
};

// att_visible is the number of keys query i attends to.
__device__ __forceinline__ int att_visible(int i, int Tk, int QPos, int KPos) {
	return min(max(QPos + i - KPos + 1, 0), Tk);
}

// att_load_kv stages keys/values j0.. j0+ATT_BC-1 of head kvh into shared
// memory (zeros past Tk). All threads of the block take part.
__device__ __forceinline__ void att_load_kv(float (*Ks)[ATT_HD_MAX + 1], float (*Vs)[ATT_HD_MAX + 1], const float *k, const float *v,
					   int b, int kvh, int j0, int Tk, int NKV, int HD) {
	for (int e = threadIdx.x; e < ATT_BC * HD; e += blockDim.x) {
		int jj = e / HD, d = e % HD, j = j0 + jj;
		float kv = 0, vv = 0;
		if (j < Tk) {
			long long off = (((long long)b * Tk + j) * NKV + kvh) * HD + d;
			kv = k[off];
			vv = v[off];
		}
		Ks[jj][d] = kv;
		Vs[jj][d] = vv;
	}
}

// attention_fwd: grid (ceil(Tq/ATT_WARPS), NH, B). Rows that see no key
// get out = 0 and lse = -Inf.
extern "C" __global__ void attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
					 int B, int Tq, int Tk, int NH, int NKV, int HD, int QPos, int KPos) {
	__shared__ float Ks[ATT_BC][ATT_HD_MAX + 1];
	__shared__ float Vs[ATT_BC][ATT_HD_MAX + 1];
	__shared__ float Qs[ATT_WARPS][ATT_HD_MAX];
	__shared__ float Ps[ATT_WARPS][ATT_BC];
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int b = blockIdx.z, h = blockIdx.y, kvh = h / (NH / NKV);
	int i = blockIdx.x * ATT_WARPS + warp;
	bool active = i < Tq;
	int vis = active ? att_visible(i, Tk, QPos, KPos) : 0;
	int iLast = min((int)(blockIdx.x + 1) * ATT_WARPS, Tq) - 1;
	int last = att_visible(iLast, Tk, QPos, KPos); // keys any row of the block sees
	float scale = (float)(1.0 / sqrt((double)HD));
	long long qoff = (((long long)b * Tq + i) * NH + h) * HD;
	if (active) {
		for (int d = lane; d < HD; d += 32) {
			Qs[warp][d] = q[qoff + d];
		}
	}
	float o[ATT_DPL];
	for (int x = 0; x < ATT_DPL; x++) {
		o[x] = 0;
	}
	float m = TITAN_NEG_INF, l = 0;
	for (int j0 = 0; j0 < last; j0 += ATT_BC) {
		__syncthreads(); // the previous tile is no longer read
		att_load_kv(Ks, Vs, k, v, b, kvh, j0, Tk, NKV, HD);
		__syncthreads();
		if (j0 >= vis) {
			continue; // warp-uniform: this row sees nothing of the tile
		}
		int jj = lane;
		float s = TITAN_NEG_INF;
		if (j0 + jj < vis) {
			float acc = 0;
			for (int d = 0; d < HD; d++) {
				acc += Qs[warp][d] * Ks[jj][d];
			}
			s = acc * scale;
		}
		float mNew = fmaxf(m, warp_max(s));
		float p = j0 + jj < vis ? expf(s - mNew) : 0.0f;
		float corr = expf(m - mNew); // 0 on the row's first tile
		l = l * corr + warp_sum(p);
		m = mNew;
		Ps[warp][jj] = p;
		__syncwarp();
		int cols = min(ATT_BC, vis - j0);
		for (int x = 0; x < ATT_DPL; x++) {
			int d = lane + 32 * x;
			if (d < HD) {
				float acc = 0;
				for (int c = 0; c < cols; c++) {
					acc += Ps[warp][c] * Vs[c][d];
				}
				o[x] = o[x] * corr + acc;
			}
		}
		__syncwarp();
	}
	if (!active) {
		return;
	}
	long long loff = ((long long)b * NH + h) * Tq + i;
	if (vis == 0) {
		for (int d = lane; d < HD; d += 32) {
			out[qoff + d] = 0;
		}
		if (lane == 0) {
			lse[loff] = TITAN_NEG_INF;
		}
		return;
	}
	float inv = 1.0f / l;
	for (int x = 0; x < ATT_DPL; x++) {
		int d = lane + 32 * x;
		if (d < HD) {
			out[qoff + d] = o[x] * inv;
		}
	}
	if (lane == 0) {
		lse[loff] = (float)((double)m + log((double)l));
	}
}

// attention_bwd_d writes D[b, h, i] = dout[b, i, h, :] . out[b, i, h, :],
// one warp per row (grid ceil(B*Tq*NH/ATT_WARPS)).
extern "C" __global__ void attention_bwd_d(float *D, const float *dout, const float *out, int B, int Tq, int NH, int HD) {
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	long long r = (long long)blockIdx.x * (blockDim.x >> 5) + warp; // (b*Tq + i)*NH + h
	if (r >= (long long)B * Tq * NH) {
		return;
	}
	float acc = 0;
	for (int d = lane; d < HD; d += 32) {
		acc += dout[r * HD + d] * out[r * HD + d];
	}
	acc = warp_sum(acc);
	if (lane == 0) {
		int h = (int)(r % NH);
		long long bi = r / NH;
		int i = (int)(bi % Tq), b = (int)(bi / Tq);
		D[((long long)b * NH + h) * Tq + i] = acc;
	}
}

// attention_bwd_dq accumulates dq: grid (ceil(Tq/ATT_WARPS), NH, B). For
// each key tile it recomputes P = exp(scale q.k - lse), dP = dout.v and
// dS = P (dP - D), and adds dq += scale dS k.
extern "C" __global__ void attention_bwd_dq(float *dq, const float *dout, const float *q, const float *k, const float *v,
					    const float *lse, const float *D,
					    int B, int Tq, int Tk, int NH, int NKV, int HD, int QPos, int KPos) {
	__shared__ float Ks[ATT_BC][ATT_HD_MAX + 1];
	__shared__ float Vs[ATT_BC][ATT_HD_MAX + 1];
	__shared__ float Qs[ATT_WARPS][ATT_HD_MAX];
	__shared__ float Os[ATT_WARPS][ATT_HD_MAX];
	__shared__ float Ss[ATT_WARPS][ATT_BC];
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int b = blockIdx.z, h = blockIdx.y, kvh = h / (NH / NKV);
	int i = blockIdx.x * ATT_WARPS + warp;
	bool active = i < Tq;
	int vis = active ? att_visible(i, Tk, QPos, KPos) : 0;
	int iLast = min((int)(blockIdx.x + 1) * ATT_WARPS, Tq) - 1;
	int last = att_visible(iLast, Tk, QPos, KPos);
	float scale = (float)(1.0 / sqrt((double)HD));
	long long qoff = (((long long)b * Tq + i) * NH + h) * HD;
	long long loff = ((long long)b * NH + h) * Tq + i;
	float L = 0, Dd = 0;
	if (active) {
		for (int d = lane; d < HD; d += 32) {
			Qs[warp][d] = q[qoff + d];
			Os[warp][d] = dout[qoff + d];
		}
		L = lse[loff];
		Dd = D[loff];
	}
	float acc[ATT_DPL];
	for (int x = 0; x < ATT_DPL; x++) {
		acc[x] = 0;
	}
	for (int j0 = 0; j0 < last; j0 += ATT_BC) {
		__syncthreads();
		att_load_kv(Ks, Vs, k, v, b, kvh, j0, Tk, NKV, HD);
		__syncthreads();
		if (j0 >= vis) {
			continue;
		}
		int jj = lane;
		float ds = 0;
		if (j0 + jj < vis) {
			float s = 0, dp = 0;
			for (int d = 0; d < HD; d++) {
				s += Qs[warp][d] * Ks[jj][d];
				dp += Os[warp][d] * Vs[jj][d];
			}
			float p = expf(s * scale - L);
			ds = p * (dp - Dd);
		}
		Ss[warp][jj] = ds;
		__syncwarp();
		int cols = min(ATT_BC, vis - j0);
		for (int x = 0; x < ATT_DPL; x++) {
			int d = lane + 32 * x;
			if (d < HD) {
				float a = 0;
				for (int c = 0; c < cols; c++) {
					a += Ss[warp][c] * Ks[c][d];
				}
				acc[x] += a;
			}
		}
		__syncwarp();
	}
	if (!active || vis == 0) {
		return;
	}
	for (int x = 0; x < ATT_DPL; x++) {
		int d = lane + 32 * x;
		if (d < HD) {
			dq[qoff + d] += scale * acc[x];
		}
	}
}

// attention_bwd_dkdv accumulates dk and dv for one tile of ATT_BC keys of
// one key/value head: grid (ceil(Tk/ATT_BC), NKV, B). It walks the
// (query head of the group, query row) pairs that see the tile,
// ATT_WARPS at a time (one per warp); lane l recomputes P and dS for key
// l, and then every thread adds the products into the elements of the
// dk/dv tile it owns (element e = threadIdx.x + blockDim.x*x of the
// ATT_BC × HD tile).
#define ATT_KV_PER_THREAD (ATT_BC * ATT_HD_MAX / (ATT_WARPS * 32))
extern "C" __global__ void attention_bwd_dkdv(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
					      const float *lse, const float *D,
					      int B, int Tq, int Tk, int NH, int NKV, int HD, int QPos, int KPos) {
	__shared__ float Ks[ATT_BC][ATT_HD_MAX + 1];
	__shared__ float Vs[ATT_BC][ATT_HD_MAX + 1];
	__shared__ float Qs[ATT_WARPS][ATT_HD_MAX];
	__shared__ float Os[ATT_WARPS][ATT_HD_MAX];
	__shared__ float Ps[ATT_WARPS][ATT_BC];
	__shared__ float Ss[ATT_WARPS][ATT_BC];
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int b = blockIdx.z, kvh = blockIdx.y, j0 = blockIdx.x * ATT_BC;
	int group = NH / NKV;
	float scale = (float)(1.0 / sqrt((double)HD));
	att_load_kv(Ks, Vs, k, v, b, kvh, j0, Tk, NKV, HD);
	int iStart = max(j0 + KPos - QPos, 0); // the first query that sees key j0
	int rows = max(Tq - iStart, 0);
	long long pairs = (long long)group * rows;
	float adk[ATT_KV_PER_THREAD], adv[ATT_KV_PER_THREAD];
	for (int x = 0; x < ATT_KV_PER_THREAD; x++) {
		adk[x] = 0;
		adv[x] = 0;
	}
	for (long long p0 = 0; p0 < pairs; p0 += ATT_WARPS) {
		long long pr = p0 + warp;
		bool active = pr < pairs;
		int h = 0, i = 0, vis = 0;
		float L = 0, Dd = 0;
		long long qoff = 0;
		__syncthreads(); // the previous rows are no longer read (and K/V are staged)
		if (active) {
			h = kvh * group + (int)(pr / rows);
			i = iStart + (int)(pr % rows);
			vis = att_visible(i, Tk, QPos, KPos);
			qoff = (((long long)b * Tq + i) * NH + h) * HD;
			long long loff = ((long long)b * NH + h) * Tq + i;
			L = lse[loff];
			Dd = D[loff];
			for (int d = lane; d < HD; d += 32) {
				Qs[warp][d] = q[qoff + d];
				Os[warp][d] = dout[qoff + d];
			}
		} else {
			for (int d = lane; d < HD; d += 32) {
				Qs[warp][d] = 0; // stale shared memory could hold NaN
				Os[warp][d] = 0;
			}
		}
		__syncwarp();
		int jj = lane;
		float pv = 0, ds = 0;
		if (active && j0 + jj < vis) {
			float s = 0, dp = 0;
			for (int d = 0; d < HD; d++) {
				s += Qs[warp][d] * Ks[jj][d];
				dp += Os[warp][d] * Vs[jj][d];
			}
			pv = expf(s * scale - L);
			ds = pv * (dp - Dd);
		}
		Ps[warp][jj] = pv;
		Ss[warp][jj] = ds;
		__syncthreads();
		for (int x = 0; x < ATT_KV_PER_THREAD; x++) {
			int e = threadIdx.x + blockDim.x * x;
			if (e < ATT_BC * HD) {
				int c = e / HD, d = e % HD;
				float sv = 0, sk = 0;
				for (int w = 0; w < ATT_WARPS; w++) {
					sv += Ps[w][c] * Os[w][d];
					sk += Ss[w][c] * Qs[w][d];
				}
				adv[x] += sv;
				adk[x] += sk;
			}
		}
	}
	for (int x = 0; x < ATT_KV_PER_THREAD; x++) {
		int e = threadIdx.x + blockDim.x * x;
		if (e < ATT_BC * HD) {
			int c = e / HD, d = e % HD, j = j0 + c;
			if (j < Tk) {
				long long off = (((long long)b * Tk + j) * NKV + kvh) * HD + d;
				dv[off] += adv[x];
				dk[off] += scale * adk[x];
			}
		}
	}
}
