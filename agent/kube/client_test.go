package kube

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// TestClientsetRequests checks the requests of the methods client-go's generated clients
// have beyond the generic verbs, against what those send: verb, path, content type.
func TestClientsetRequests(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/api/v1/namespaces/ns/serviceaccounts/default/token":
			_ = json.NewEncoder(w).Encode(&authenticationv1.TokenRequest{
				TypeMeta: metav1.TypeMeta{APIVersion: "authentication.k8s.io/v1", Kind: "TokenRequest"},
				Status:   authenticationv1.TokenRequestStatus{Token: "t"},
			})
		case r.URL.Path == "/api/v1/nodes/gw/status":
			_ = json.NewEncoder(w).Encode(&v1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: "gw"}})
		case strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/ns/pods"):
			_ = json.NewEncoder(w).Encode(&v1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}})
		case r.URL.Path == "/api/v1/pods":
			_ = json.NewEncoder(w).Encode(&v1.PodList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"}, Items: []v1.Pod{{ObjectMeta: metav1.ObjectMeta{Name: "web"}}}})
		case strings.HasPrefix(r.URL.Path, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"):
			_ = json.NewEncoder(w).Encode(&coordinationv1.Lease{TypeMeta: metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"}, ObjectMeta: metav1.ObjectMeta{Name: "gw"}})
		case r.URL.Path == "/apis/authentication.k8s.io/v1/tokenreviews":
			_ = json.NewEncoder(w).Encode(&authenticationv1.TokenReview{TypeMeta: metav1.TypeMeta{APIVersion: "authentication.k8s.io/v1", Kind: "TokenReview"}, Status: authenticationv1.TokenReviewStatus{Authenticated: true}})
		default:
			_ = json.NewEncoder(w).Encode(&v1.Event{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Event"}, ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e"}})
		}
	}))
	defer srv.Close()
	cs, err := NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if pod, err := cs.CoreV1().Pods("ns").Get(ctx, "web", metav1.GetOptions{}); err != nil || pod.Name != "web" {
		t.Fatalf("get pod: %v, %v", pod, err)
	}
	pods := cs.CoreV1().Pods("ns")
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	if _, err := pods.Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update pod: %v", err)
	}
	if _, err := pods.Patch(ctx, "web", types.StrategicMergePatchType, []byte(`{}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("patch pod status: %v", err)
	}
	if err := pods.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	if list, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=gw"}); err != nil || len(list.Items) != 1 {
		t.Fatalf("list pods: %v, %v", list, err)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-node-lease", Name: "gw"}}
	if _, err := cs.CoordinationV1().Leases("kube-node-lease").Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update lease: %v", err)
	}
	if tr, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{}, metav1.CreateOptions{}); err != nil || !tr.Status.Authenticated {
		t.Fatalf("token review: %v, %v", tr, err)
	}
	if node, err := cs.CoreV1().Nodes().PatchStatus(ctx, "gw", []byte(`{}`)); err != nil || node.Name != "gw" {
		t.Fatalf("patch node status: %v, %v", node, err)
	}
	tr, err := cs.CoreV1().ServiceAccounts("ns").CreateToken(ctx, "default", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil || tr.Status.Token != "t" {
		t.Fatalf("create token: %v, %v", tr, err)
	}
	sink := &EventSink{Interface: cs.CoreV1().Events("")}
	event := &v1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e"}}
	for name, write := range map[string]func() (*v1.Event, error){
		"create": func() (*v1.Event, error) { return sink.Create(event) },
		"update": func() (*v1.Event, error) { return sink.Update(event) },
		"patch":  func() (*v1.Event, error) { return sink.Patch(event, []byte(`{}`)) },
	} {
		if _, err := write(); err != nil {
			t.Fatalf("%s event: %v", name, err)
		}
	}
	if _, err := cs.CoreV1().Events("other").CreateWithEventNamespace(event); err == nil {
		t.Fatal("an event of namespace ns created through a client of namespace other")
	}
	want := map[string]bool{
		"GET /api/v1/namespaces/ns/pods/web ":                                                true,
		"POST /api/v1/namespaces/ns/pods application/vnd.kubernetes.protobuf":                true,
		"PUT /api/v1/namespaces/ns/pods/web application/vnd.kubernetes.protobuf":             true,
		"PATCH /api/v1/namespaces/ns/pods/web/status application/strategic-merge-patch+json": true,
		"DELETE /api/v1/namespaces/ns/pods/web application/vnd.kubernetes.protobuf":          true,
		"GET /api/v1/pods ": true,
		"PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/gw application/vnd.kubernetes.protobuf": true,
		"POST /apis/authentication.k8s.io/v1/tokenreviews application/vnd.kubernetes.protobuf":                      true,
		"PATCH /api/v1/nodes/gw/status application/strategic-merge-patch+json":                                      true,
		"POST /api/v1/namespaces/ns/serviceaccounts/default/token application/vnd.kubernetes.protobuf":              true,
		"POST /api/v1/namespaces/ns/events application/json":                                                        true,
		"PUT /api/v1/namespaces/ns/events/e application/json":                                                       true,
		"PATCH /api/v1/namespaces/ns/events/e application/strategic-merge-patch+json":                               true,
	}
	mu.Lock()
	defer mu.Unlock()
	for _, g := range got {
		if !want[g] {
			t.Errorf("unexpected request %q", g)
		}
		delete(want, g)
	}
	for w := range want {
		t.Errorf("missing request %q", w)
	}
}
