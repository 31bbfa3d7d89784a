// Package certificate is client-go's util/certificate and util/certificate/csr (k8s.io/client-go
// v0.37.2, Apache License 2.0, the Kubernetes Authors: the files keep their license headers)
// over kube.Interface: the certificate manager that renews the node's client and serving
// certificates by CSR, and its file store. client-go's package imports the full clientset, and
// with it the code of every API group, about 15 MiB of the agent's binary (issue 31).
//
// The changes: kube.Interface for kubernetes.Interface, one package for the two, and no
// fallback to certificates.k8s.io/v1beta1 (served by no apiserver since 1.22; v1 since 1.19).
package certificate
