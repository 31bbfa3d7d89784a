// Command genv1db writes a state database of schema v1, the schema of
// holdfast's first prototype (drawn in offline/doc.go), for the migration
// test. It stands in for the old code that wrote such files: keep it writing
// exactly v1, never the current schema.
//
// Regenerate the committed file with:
//
//	go run ./offline/internal/genv1db -out offline/testdata/schema-v1.db
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func main() {
	out := flag.String("out", "offline/testdata/schema-v1.db", "file to write (replaced)")
	flag.Parse()
	if err := write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "genv1db:", err)
		os.Exit(1)
	}
}

// v1PodEntry is the v1 value under pods/<namespace>/<name>.
type v1PodEntry struct {
	Source     string    `json:"source"`
	Pod        *v1.Pod   `json:"pod"`
	AdmittedAt time.Time `json:"admittedAt"`
}

var admittedAt = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func pod(ns, name, uid string) *v1.Pod {
	return &v1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), ResourceVersion: "41"},
		Spec: v1.PodSpec{
			NodeName:   "gw-01",
			Containers: []v1.Container{{Name: "app", Image: "docker.io/local/busybox:1", Command: []string{"sleep", "3600"}}},
		},
	}
}

func write(path string) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Update(func(tx *bolt.Tx) error {
		put := func(bucket, key string, v any) error {
			b, err := tx.CreateBucketIfNotExists([]byte(bucket))
			if err != nil {
				return err
			}
			raw, ok := v.([]byte)
			if !ok {
				if raw, err = json.Marshal(v); err != nil {
					return err
				}
			}
			return b.Put([]byte(key), raw)
		}
		static := pod("kube-system", "edge-proxy-gw-01", "6f1b6a3e-0000-4000-8000-000000000002")
		static.Annotations = map[string]string{"kubernetes.io/config.source": "file"}
		steps := []error{
			put("meta", "version", []byte("1")),
			put("meta", "node_name", []byte("gw-01")),
			put("pods", "default/sensor-reader", v1PodEntry{"api", pod("default", "sensor-reader", "6f1b6a3e-0000-4000-8000-000000000001"), admittedAt}),
			put("pods", "kube-system/edge-proxy-gw-01", v1PodEntry{"file", static, admittedAt.Add(time.Minute)}),
			// The prototype wrote what it got; these two must be quarantined.
			put("pods", "default/no-uid", v1PodEntry{"api", pod("default", "no-uid", ""), admittedAt}),
			put("pods", "default/torn", []byte(`{"source":"api","pod":{"metadata":{"name":"to`)),
			put("configmaps", "default/sensor-config", &v1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sensor-config", ResourceVersion: "17"},
				Data:       map[string]string{"interval": "5s"},
			}),
			put("secrets", "default/sensor-token", &v1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sensor-token", ResourceVersion: "18"},
				Data:       map[string][]byte{"token": []byte("s3cr3t")},
			}),
			put("node", "node", &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gw-01", ResourceVersion: "99"}}),
		}
		for _, err := range steps {
			if err != nil {
				return err
			}
		}
		return nil
	})
}
