package control

import (
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/titan-go/titan/internal/control/controlpb"
)

// fuzzCall decodes payload as the request of method m and calls the
// service; ok is false when the payload is not such a request.
func fuzzCall(ctx context.Context, v *service, m byte, payload []byte) (resp proto.Message, ok bool, err error) {
	dec := func(req proto.Message) bool { return proto.Unmarshal(payload, req) == nil }
	switch m % 10 {
	case 0:
		if req := new(pb.PingRequest); dec(req) {
			resp, err = v.Ping(ctx, req)
			return resp, true, err
		}
	case 1:
		if req := new(pb.JoinRequest); dec(req) {
			resp, err = v.Join(ctx, req)
			return resp, true, err
		}
	case 2:
		if req := new(pb.MembersRequest); dec(req) {
			resp, err = v.Members(ctx, req)
			return resp, true, err
		}
	case 3:
		if req := new(pb.SetRequest); dec(req) {
			resp, err = v.Set(ctx, req)
			return resp, true, err
		}
	case 4:
		if req := new(pb.GetRequest); dec(req) {
			resp, err = v.Get(ctx, req)
			return resp, true, err
		}
	case 5:
		if req := new(pb.WaitRequest); dec(req) {
			resp, err = v.Wait(ctx, req)
			return resp, true, err
		}
	case 6:
		if req := new(pb.AddRequest); dec(req) {
			resp, err = v.Add(ctx, req)
			return resp, true, err
		}
	case 7:
		if req := new(pb.BarrierRequest); dec(req) {
			resp, err = v.Barrier(ctx, req)
			return resp, true, err
		}
	case 8:
		if req := new(pb.HeartbeatRequest); dec(req) {
			resp, err = v.Heartbeat(ctx, req)
			return resp, true, err
		}
	case 9:
		if req := new(pb.ReportExitRequest); dec(req) {
			resp, err = v.ReportExit(ctx, req)
			return resp, true, err
		}
	}
	return nil, false, nil
}

func fuzzOp(m, cred byte, req proto.Message) []byte {
	b, err := proto.Marshal(req)
	if err != nil || len(b) > 255 {
		panic("seed request too long")
	}
	return append([]byte{m, cred, byte(len(b))}, b...)
}

// FuzzServer drives one server's handlers, in process, with a sequence of
// hostile calls decoded from the input (method, credentials, protobuf
// request bytes): no panic, every error a gRPC status (never Unknown or
// Internal), every call with wrong credentials refused with the one
// answer and no effect, and the server's state consistent after each call.
func FuzzServer(f *testing.F) {
	join := func(node, local int32) []byte {
		return fuzzOp(1, 0, &pb.JoinRequest{NodeRank: node, LocalRank: local, LocalWorldSize: 1, Addr: "h:1"})
	}
	var seq []byte
	seq = append(seq, fuzzOp(3, 0, &pb.SetRequest{Key: "k", Value: []byte("v")})...)
	seq = append(seq, fuzzOp(6, 0, &pb.AddRequest{Key: "k", Delta: 1})...)
	seq = append(seq, fuzzOp(6, 0, &pb.AddRequest{Key: "n", Delta: 1<<63 - 1})...)
	seq = append(seq, fuzzOp(6, 0, &pb.AddRequest{Key: "n", Delta: 1})...)
	seq = append(seq, fuzzOp(4, 0, &pb.GetRequest{Key: "n"})...)
	seq = append(seq, fuzzOp(7, 0, &pb.BarrierRequest{Name: "b", N: 1})...)
	seq = append(seq, fuzzOp(8, 0, &pb.HeartbeatRequest{Rank: -1})...)
	seq = append(seq, fuzzOp(9, 0, &pb.ReportExitRequest{Rank: 2, Code: -9, Reason: "x"})...)
	f.Add(uint8(0), seq)
	f.Add(uint8(0), append(append(join(0, 0), join(0, 0)...), fuzzOp(2, 0, &pb.MembersRequest{})...))
	f.Add(uint8(2), append(append(join(0, 0), join(1, 0)...), join(2, 0)...))
	f.Add(uint8(1), append(join(1, 0), fuzzOp(1, 0, &pb.JoinRequest{NodeRank: 1 << 30, LocalRank: 1, LocalWorldSize: 1 << 30})...))
	f.Add(uint8(0), append(fuzzOp(3, 1, &pb.SetRequest{Key: "k"}), fuzzOp(2, 2, &pb.MembersRequest{})...))
	f.Add(uint8(0), []byte{5, 0, 3, 0x0a, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, world uint8, data []byte) {
		// Calls run one after the other, so only a world of one completes
		// its rendezvous; larger ones see joins time out.
		fuzzWorld := 1 + int(world%3)
		s := newServer(ServerConfig{JobID: testJob, Secret: testSecret, WorldSize: fuzzWorld, HeartbeatTimeout: time.Second})
		v := &service{s: s}
		for len(data) >= 3 {
			m, cred, n := data[0], data[1]%4, int(data[2])
			data = data[3:]
			payload := data[:min(n, len(data))]
			data = data[len(payload):]
			md := metadata.Pairs(MetadataJobID, testJob, MetadataSecret, testSecret)
			switch cred {
			case 1:
				md = metadata.Pairs(MetadataJobID, testJob, MetadataSecret, testSecret+"x")
			case 2:
				md = metadata.Pairs(MetadataJobID, "other", MetadataSecret, testSecret)
			case 3:
				md = metadata.MD{}
			}
			ctx, cancel := context.WithTimeout(metadata.NewIncomingContext(context.Background(), md), time.Millisecond)
			if err := s.authorize(ctx); (err == nil) != (cred == 0) {
				cancel()
				t.Fatalf("credentials %d: authorize = %v", cred, err)
			} else if err != nil {
				cancel()
				if st := status.Convert(err); st.Code() != codes.Unauthenticated || st.Message() != NotAdmitted {
					t.Fatalf("refusal %v, want %q", err, NotAdmitted)
				}
				continue // the interceptor stops the call here
			}
			resp, ok, err := fuzzCall(ctx, v, m, payload)
			cancel()
			if !ok {
				continue
			}
			if err != nil {
				st, isStatus := status.FromError(err)
				if !isStatus || st.Code() == codes.Unknown || st.Code() == codes.Internal || st.Code() == codes.OK {
					t.Fatalf("method %d: error %v is not a proper status", m%10, err)
				}
			}
			s.mu.Lock()
			nm, complete := len(s.members), s.complete
			for r, mem := range s.members {
				if r < 0 || r >= fuzzWorld || mem.Rank != r {
					s.mu.Unlock()
					t.Fatalf("member %+v under rank %d", mem, r)
				}
			}
			if a, isAdd := resp.(*pb.AddResponse); isAdd && err == nil {
				var key string
				var req pb.AddRequest
				proto.Unmarshal(payload, &req)
				key = req.Key
				if got := string(s.kv[key]); got != strconv.FormatInt(a.Value, 10) {
					s.mu.Unlock()
					t.Fatalf("add %q returned %d, stored %q", key, a.Value, got)
				}
			}
			s.mu.Unlock()
			if nm > fuzzWorld || complete != (nm == fuzzWorld) {
				t.Fatalf("%d members, complete %v, in a world of %d", nm, complete, fuzzWorld)
			}
		}
	})
}

// FuzzAuthorize: a call is admitted exactly when it presents the job id
// and the secret, and every refusal is the same.
func FuzzAuthorize(f *testing.F) {
	f.Add(testJob, testSecret)
	f.Add(testJob, testSecret+"\x00")
	f.Add("", "")
	f.Add(testJob[:3], testSecret)
	s := newServer(ServerConfig{JobID: testJob, Secret: testSecret, WorldSize: 1})
	f.Fuzz(func(t *testing.T, job, secret string) {
		md := metadata.MD{MetadataJobID: []string{job}, MetadataSecret: []string{secret}}
		err := s.authorize(metadata.NewIncomingContext(context.Background(), md))
		if want := job == testJob && secret == testSecret; (err == nil) != want {
			t.Fatalf("job %q secret %q: authorize = %v, want admitted %v", job, secret, err, want)
		}
		if err != nil && err != errNotAdmitted {
			t.Fatalf("refusal %v, want the one refusal", err)
		}
	})
}
