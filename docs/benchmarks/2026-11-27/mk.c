#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>
#include <string.h>
static const char *root; static int nthreads, nfiles; static const char *mode;
static void *work(void *arg){ long t=(long)arg; char dir[4096],p[4200];
 snprintf(dir,sizeof dir,"%s/t%ld",root,t); mkdir(dir,0755);
 for(int i=t;i<nfiles;i+=nthreads){ snprintf(p,sizeof p,"%s/f%08d",dir,i);
  if(!strcmp(mode,"create")){int fd=open(p,O_WRONLY|O_CREAT|O_EXCL,0644); if(fd<0){perror(p);exit(1);} close(fd);}
  else if(!strcmp(mode,"small")){int fd=open(p,O_WRONLY|O_CREAT|O_EXCL,0644); if(fd<0){perror(p);exit(1);} char b[4096]={1}; write(fd,b,4096); close(fd);}
  else if(!strcmp(mode,"unlink")){ if(unlink(p)){perror(p);exit(1);} }
  else if(!strcmp(mode,"stat")){ struct stat st; if(stat(p,&st)){perror(p);exit(1);} }
 } return 0;}
int main(int c,char**v){ root=v[1]; mode=v[2]; nthreads=atoi(v[3]); nfiles=atoi(v[4]);
 pthread_t th[256]; struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a);
 for(long t=0;t<nthreads;t++) pthread_create(&th[t],0,work,(void*)t);
 for(int t=0;t<nthreads;t++) pthread_join(th[t],0);
 clock_gettime(CLOCK_MONOTONIC,&b); double s=(b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)/1e9;
 printf("%s %d threads %d files: %.3f s, %.0f/s\n",mode,nthreads,nfiles,s,nfiles/s); return 0;}
