#include <openssl/crypto.h>
#include <stdio.h>
int main(void){printf("%s\n", OpenSSL_version(OPENSSL_VERSION));return 0;}
